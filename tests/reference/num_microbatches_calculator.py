"""Megatron-LM's global batch size per iteration, transcribed from its source as an independent
reference for training/batch_size_schedule.h:

  megatron/core/num_microbatches_calculator.py   ConstantNumMicroBatchesCalculator,
                                                 RampupBatchsizeNumMicroBatchesCalculator,
                                                 StepBatchsizeNumMicroBatchesCalculator
  megatron/training/training.py                  update_train_iters, and train()'s accounting:
                                                 update_num_microbatches(consumed) before each
                                                 iteration, consumed += dp * micro * num_micro after

  num_microbatches_calculator.py CONFIG_JSON
      CONFIG: {"global_batch_size", "micro_batch_size", "data_parallel_size", "seq_length",
               "rampup_batch_size": [start, incr, samples] | null,
               "step_batch_size_schedule": "T:B ..." | null,
               "train_iters": N | null, "train_samples": N | null}
      prints {"train_iters": N, "iterations": [[global batch, num micro-batches, consumed before], ...]}
"""
import json
import sys


class Constant:
    def __init__(self, global_batch_size, micro_batch_size, data_parallel_size):
        unit = micro_batch_size * data_parallel_size
        assert global_batch_size % unit == 0, "global batch size not divisible"
        self.num_micro_batches = global_batch_size // unit
        self.current_global_batch_size = global_batch_size

    def update(self, consumed_samples, consistency_check):
        pass


class Rampup:
    def __init__(self, global_batch_size, micro_batch_size, data_parallel_size, start, incr, samples):
        self.global_batch_size = global_batch_size
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.start_global_batch_size = start
        self.batch_size_increment = incr
        self.ramup_samples = samples
        diff_batch_size = global_batch_size - start
        assert diff_batch_size >= 0
        assert diff_batch_size % incr == 0
        num_increments = diff_batch_size // incr
        self.rampup_samples_per_increment = self.ramup_samples / num_increments
        self.update(0, False)

    def update(self, consumed_samples, consistency_check):
        if consumed_samples > self.ramup_samples:
            self.current_global_batch_size = self.global_batch_size
        else:
            steps = int(consumed_samples / self.rampup_samples_per_increment)
            self.current_global_batch_size = self.start_global_batch_size + steps * self.batch_size_increment
            assert self.current_global_batch_size <= self.global_batch_size
        if consistency_check:
            assert self.current_global_batch_size % self.micro_batch_times_data_parallel_size == 0
        self.num_micro_batches = self.current_global_batch_size // self.micro_batch_times_data_parallel_size


class Step:
    def __init__(self, micro_batch_size, data_parallel_size, schedule, seq_length):
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.schedule = self._parse_schedule(schedule, seq_length)
        assert len(self.schedule) > 0
        assert self.schedule[0][0] == 0
        for i in range(1, len(self.schedule)):
            assert self.schedule[i][0] > self.schedule[i - 1][0]
        for _, batch_size in self.schedule:
            assert batch_size > 0
        self.global_batch_size = self.schedule[-1][1]
        self.update(0, False)

    @staticmethod
    def _parse_numeric_value(value_str):
        value_str = value_str.strip().upper()
        multiplier = 1
        for suffix, m in (("T", 1_000_000_000_000), ("B", 1_000_000_000), ("M", 1_000_000), ("K", 1_000)):
            if value_str.endswith(suffix):
                multiplier = m
                value_str = value_str[:-1]
                break
        return int(float(value_str) * multiplier)

    @classmethod
    def _parse_schedule(cls, schedule_str, seq_length):
        schedule = []
        for entry in schedule_str.strip().replace(",", " ").split():
            threshold_str, batch_size_str = entry.split(":", 1)
            threshold = cls._parse_numeric_value(threshold_str)
            batch_size = cls._parse_numeric_value(batch_size_str)
            if seq_length is not None:
                threshold = threshold // seq_length
            schedule.append((threshold, batch_size))
        schedule.sort(key=lambda x: x[0])
        return schedule

    def update(self, consumed_samples, consistency_check):
        batch_size = self.schedule[0][1]
        for threshold, bs in self.schedule:
            if consumed_samples >= threshold:
                batch_size = bs
            else:
                break
        self.current_global_batch_size = batch_size
        if consistency_check:
            assert batch_size % self.micro_batch_times_data_parallel_size == 0
        self.num_micro_batches = batch_size // self.micro_batch_times_data_parallel_size


def main():
    c = json.loads(sys.argv[1])
    mbs, dp = c["micro_batch_size"], c["data_parallel_size"]
    if c.get("rampup_batch_size"):
        start, incr, samples = c["rampup_batch_size"]
        calc = Rampup(c["global_batch_size"], mbs, dp, start, incr, samples)
        gbs = c["global_batch_size"]
    elif c.get("step_batch_size_schedule"):
        calc = Step(mbs, dp, c["step_batch_size_schedule"], c["seq_length"])
        gbs = calc.global_batch_size
    else:
        gbs = c["global_batch_size"]
        calc = Constant(gbs, mbs, dp)

    # update_train_iters
    train_iters = c.get("train_iters")
    if not train_iters:
        if not c.get("rampup_batch_size"):
            train_iters = c["train_samples"] // gbs
        else:
            iterations = 0
            consumed_samples = 0
            while consumed_samples <= int(c["rampup_batch_size"][2]):
                calc.update(consumed_samples, False)
                consumed_samples += calc.current_global_batch_size
                iterations += 1
            calc.update(0, False)
            iterations += (c["train_samples"] - consumed_samples) // gbs
            train_iters = iterations

    # train(): the batch of each iteration from the samples consumed before it
    consumed = 0
    rows = []
    for _ in range(train_iters):
        calc.update(consumed, True)
        rows.append([calc.current_global_batch_size, calc.num_micro_batches, consumed])
        consumed += dp * mbs * calc.num_micro_batches
    print(json.dumps({"train_iters": train_iters, "iterations": rows}))


if __name__ == "__main__":
    main()
