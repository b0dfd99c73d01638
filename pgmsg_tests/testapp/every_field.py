"""A model with one column of every field type Django ships, behind a trigger channel."""

import pgtrigger
from django.contrib.postgres import fields as pg
from django.db import models

import pgmsg
from pgmsg_tests.testapp.models import Order


class EveryField(models.Model):
    big = models.BigIntegerField(null=True)
    binary = models.BinaryField(null=True)
    boolean = models.BooleanField(null=True)
    char = models.CharField(max_length=40, null=True)
    date = models.DateField(null=True)
    datetime = models.DateTimeField(null=True)
    decimal = models.DecimalField(max_digits=20, decimal_places=6, null=True)
    duration = models.DurationField(null=True)
    email = models.EmailField(null=True)
    file = models.FileField(null=True)
    file_path = models.FilePathField(path="/tmp", null=True)
    float = models.FloatField(null=True)
    ip = models.GenericIPAddressField(null=True)
    integer = models.IntegerField(null=True)
    json = models.JSONField(null=True)
    positive_big = models.PositiveBigIntegerField(null=True)
    positive = models.PositiveIntegerField(null=True)
    positive_small = models.PositiveSmallIntegerField(null=True)
    slug = models.SlugField(null=True)
    small = models.SmallIntegerField(null=True)
    text = models.TextField(null=True)
    time = models.TimeField(null=True)
    url = models.URLField(null=True)
    uuid = models.UUIDField(null=True)
    foreign_key = models.ForeignKey(Order, null=True, on_delete=models.SET_NULL, related_name="+")
    one_to_one = models.OneToOneField(Order, null=True, on_delete=models.SET_NULL, related_name="+")
    generated = models.GeneratedField(
        expression=models.F("small") * 2, output_field=models.BigIntegerField(), db_persist=True
    )
    array = pg.ArrayField(models.IntegerField(), null=True)
    nested_array = pg.ArrayField(pg.ArrayField(models.TextField()), null=True)
    integer_range = pg.IntegerRangeField(null=True)
    big_integer_range = pg.BigIntegerRangeField(null=True)
    decimal_range = pg.DecimalRangeField(null=True)
    date_range = pg.DateRangeField(null=True)
    datetime_range = pg.DateTimeRangeField(null=True)

    class Meta:
        triggers = [
            pgmsg.ChannelTrigger(
                channel="every_field_changed",
                operation=pgtrigger.Insert | pgtrigger.Update,
            )
        ]
