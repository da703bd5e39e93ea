"""The broker's durable state in its data_dir: an append-only journal of record changes, with snapshots.

journal.py is the map (the files in data_dir and what each holds); frames.py states what is torn and what
is damaged; records.py the journal's records; snapshot.py how a snapshot's frames are made; reading.py and
replay.py read a data_dir back; compaction.py writes the next snapshot off the broker's loop; repair.py
recovers a damaged data_dir; fence.py tells a broker that it no longer holds the directory.
"""
