"""The test project as an ASGI application (uvicorn pgmsg_tests.asgi:application), with its
live streams served by pgmsg.live.asgi; ``django_only`` serves them through Django alone."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pgmsg_tests.settings")
django_only = get_asgi_application()

from pgmsg import live  # noqa: E402  (after Django is set up)

application = live.asgi(django_only)
