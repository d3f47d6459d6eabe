"""The channel between a run's driver and its reading tasks: a TCP server the driver hosts (the executors
reach the driver already), not files in a folder every executor would have to share.

- ``driver``: the process's server and each run's registration (``RunChannel``): progress, cancel, the
  throttled share, the early start's plan, the Kafka client's secrets (served to tasks that present the
  run's token, never put in what the driver ships to them).
- ``task``: a reading task's connection (``TaskChannel``).
- ``frames``: the wire format, bounded; ``progress``: the reports and their sum (``TailRead``).
"""

from __future__ import annotations

from compactord.engine.channel.driver import ChannelServer, DriverAddress, RunChannel, driver_address
from compactord.engine.channel.frames import MAX_FRAME_BYTES, FrameError
from compactord.engine.channel.progress import TailRead
from compactord.engine.channel.task import ChannelLost, TaskChannel, client_config

__all__ = ["MAX_FRAME_BYTES", "ChannelLost", "ChannelServer", "DriverAddress", "FrameError", "RunChannel",
           "TailRead", "TaskChannel", "client_config", "driver_address"]
