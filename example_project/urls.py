from django.contrib import admin
from django.urls import path

from example_project.shop import live

urlpatterns = [
    path("admin/", admin.site.urls),
    path("live/", live.page),
    path("live/orders", live.order_feed),
]
