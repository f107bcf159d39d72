"""plan/intake/: the campaign's inputs and their names: globs and lists read, URL inputs asked of their
servers, stems and the placeholders of names, the node-cache index.

Must not shape jobs (plan/job/ does) nor know the site's limits beyond what an input needs.
"""
