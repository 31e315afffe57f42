"""How the engine reaches Spark past one machine: the object-store connectors a project's
paths need (connectors.py), the one function from a project's spec to its Spark settings
(settings.py), and a local Spark Connect server with the project's jars and settings
(connect_server.py)."""
