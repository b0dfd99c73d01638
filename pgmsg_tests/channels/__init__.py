"""Tests of pgmsg/channels/."""
