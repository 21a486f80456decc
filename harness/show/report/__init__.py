"""The pull-request report of a run: report.md with PNG plots beside it, optionally
report.html (docs/REPORTS.md).

evidence.py gathers what a report shows; document.py and tables.py decide what it says;
markdown.py and html.py lay it out; plots.py and series.py draw, style.py being the one module
that imports matplotlib; write.py writes the files. Every number comes from the run's
`Comparison` (its summary.json) and is never recomputed here.
"""
