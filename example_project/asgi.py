"""The shop as an ASGI application: ``uvicorn example_project.asgi:application`` serves its
live order feed (``manage.py demo --live`` starts it). pgmsg.live.asgi wraps Django's
application so that an open feed holds no Django request (docs/live.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
django_application = get_asgi_application()

from pgmsg import live  # noqa: E402  (after Django is set up)

application = live.asgi(django_application)
