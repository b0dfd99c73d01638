"""Tests of pgmsg/inbox/."""
