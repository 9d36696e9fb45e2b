"""Finding out what went wrong: logs, the hang watchdog, collective checks, fault drills,
the live cluster check, and Ctrl-C that ends a rank within seconds.
"""
