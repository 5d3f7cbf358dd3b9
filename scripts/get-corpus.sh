#!/usr/bin/env bash
# Placeholder: replaced by the demo-corpus downloader.
exit 0
