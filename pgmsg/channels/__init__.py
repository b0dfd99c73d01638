"""Channels: declarations, notify(), trigger channels, the notification source, dead letters."""
