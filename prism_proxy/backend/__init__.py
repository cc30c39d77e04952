"""The backend: its HTTP client and the client of DART's control RPC."""
