"""Tests of pgmsg/admin/ (through the test client, and in a browser)."""
