"""Helpers shared by every test tier:

- ``daemon``: ``DaemonProcess``, the daemon as a subprocess (daemon and deploy tiers), and a topic's
  compaction over HTTP;
- ``service``: a compaction service in the test process, run to its end and read back;
- ``probes``: probes that hold a task at a checkpoint, and the pausing factory a daemon subprocess is
  started with;
- ``waiting``: ``wait_for``, the one poll-until loop; ``timeouts``: how long a test waits;
- ``processes``: a process tree read from /proc."""
