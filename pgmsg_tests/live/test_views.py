"""stream()'s checks when a view is made, and its answer outside ASGI (no server needed)."""

from __future__ import annotations

import pytest

from pgmsg import errors, live
from pgmsg_tests.testapp.channels import Shout, Work


def test_only_broadcast_channels_may_be_mounted():
    with pytest.raises(errors.ConfigurationError, match="pgmsg.live serves broadcast channels"):
        live.stream(channels=[Work], authorize=lambda request, ask: True)
    assert live.stream(channels=[Shout], categories=())


def test_a_malformed_category_fails_when_the_view_is_made():
    with pytest.raises(errors.InvalidStreamName, match="invalid category 'Bad!'"):
        live.stream(categories=["Bad!"])


@pytest.mark.django_db
def test_under_wsgi_the_view_says_it_needs_an_asgi_server(client):
    response = client.get("/live/events?category=livewsgi")
    assert response.status_code == 500
    assert b"needs an ASGI server" in response.content
