"""operate/campaign/: the campaign as a whole over time: its generations and its forecast.

Decides how a changed spec becomes the next generation of a submitted plan directory and what the
rest of the campaign will take and cost. Must not submit, poll or retry (the rooms above do, and read
the generation from the manifest).
"""
