from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pgmsg/", include("pgmsg.urls")),
    path("live/", include("pgmsg_tests.testapp.live_urls")),
]
