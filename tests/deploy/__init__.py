"""Deployment tests: the packaging files, and the daemon run as its own process, the way systemd,
Docker and Kubernetes run it (``python -m compactord run --config broker.conf``, through
``tests.support.daemon.DaemonProcess``)."""
