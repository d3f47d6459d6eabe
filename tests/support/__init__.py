"""Helpers shared by every test tier: probes that hold a task at a checkpoint, the pausing factory a
daemon subprocess is started with, waiting, timeouts."""
