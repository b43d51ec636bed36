"""Running: the command line, callbacks every run gets, checkpoint writing, the STS harness, export."""
