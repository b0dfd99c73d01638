"""Tests of pgmsg/events/."""
