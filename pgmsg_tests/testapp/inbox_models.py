"""A project's own table used as an inbox (pgmsg.ModelInbox) in the tests."""

from django.db import models

from pgmsg.inbox.model_inbox import wake_trigger


class WebhookEvent(models.Model):
    event_id = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=40)
    account = models.CharField(max_length=40, default="")
    body = models.JSONField(default=dict)
    processed_at = models.DateTimeField(null=True)

    class Meta:
        app_label = "testapp"
        triggers = [wake_trigger("test.webhooks")]
        # What the claim reads (pgmsg.W001, model_inbox.missing_claim_index).
        indexes = [
            models.Index(
                fields=["id"],
                condition=models.Q(processed_at__isnull=True),
                name="webhook_unprocessed",
            )
        ]
