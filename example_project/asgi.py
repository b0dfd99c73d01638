"""The shop as an ASGI application: ``uvicorn example_project.asgi:application`` serves its
live order feed (``manage.py demo --live`` starts it)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_asgi_application()
