"""The HTTP edge: the server, bodies, errors, endpoints and the relays of answers."""
