"""One router per resource; each is built by ``router(daemon)`` and included by ``api/app.py``."""
