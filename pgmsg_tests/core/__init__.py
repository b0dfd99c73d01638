"""Tests of pgmsg/core/."""
