"""The results store: finished tasks kept on disk in data_dir/results.sqlite3 until retention ends.

shipping.py is the broker's side (hand finished records to the archiver, let them go once stored);
archiver.py the child process that writes them and applies retention; database.py the SQLite file;
scopes.py the in-memory filter that answers "could the store hold this key?" without asking SQLite.
"""
