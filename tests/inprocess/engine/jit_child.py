"""A fresh local Spark session, warmed up as the daemon warms its own, that reports how far the JIT compiled the
closure cleaner's bytecode reader (``test_compaction.py``).

Usage: ``python -m tests.inprocess.engine.jit_child ROOT``

Prints ``LEVELS <comma-separated tiers>`` (the tiers at which the driver JVM holds compiled code of
``org.apache.xbean.asm9.ClassReader.readCode``; 4 is C2), once C2 holds it or 10 s after the warm-up.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

READ_CODE = "org.apache.xbean.asm9.ClassReader.readCode("
WAIT_S = 10.0  # for the compiler's queue after the warm-up (no job runs meanwhile)


def compiled_levels(jcmd: str, pid: int) -> list[str]:
    listing = subprocess.run([jcmd, str(pid), "Compiler.codelist"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    # Lines: "<compile id> <tier> <state> <method>(<signature>) [<addresses>]"
    return sorted({line.split()[1] for line in listing.splitlines() if READ_CODE in line})


def main(argv: list[str]) -> int:
    from compactord.config import Settings
    from compactord.engine.spark_session import SparkSessionManager

    jcmd = shutil.which("jcmd")
    if jcmd is None:
        sys.exit("jcmd (a JDK's) is not installed: the JVM's compiled code cannot be listed")
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:9", compacted_ledger_root=argv[0], spark_master="local[2]",
                        spark_conf={"spark.driver.memory": "512m"})
    manager = SparkSessionManager(settings)
    manager.start()
    try:
        manager.warm_up()
        pid = int(manager.spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        deadline = time.monotonic() + WAIT_S
        levels = compiled_levels(jcmd, pid)
        while "4" not in levels and time.monotonic() < deadline:
            time.sleep(0.5)
            levels = compiled_levels(jcmd, pid)
        print(f"LEVELS {','.join(levels)}", flush=True)
    finally:
        manager.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
