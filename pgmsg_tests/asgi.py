"""The test project as an ASGI application (uvicorn pgmsg_tests.asgi:application)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pgmsg_tests.settings")
application = get_asgi_application()
