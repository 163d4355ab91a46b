"""A project's items: read as Potato 2.12 reads them, and the JSON lines this server writes.

- ``read``           the data files' items, streamed (JSON lines, JSON arrays, CSV, TSV), and their media
- ``json_lines``     the JSON lines this server writes and reads back
"""
