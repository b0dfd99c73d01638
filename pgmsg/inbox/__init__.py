"""The transactional inbox: declarations, receive(), the inbox source, operations, health."""
