"""Reports and provenance of planner answers.

:mod:`scaleplan.report.provenance` (light: no plotting imports) names the calibration and table runs an
answer used; :mod:`scaleplan.report.html` builds the self-contained HTML report from the commands'
JSON outputs (plain dicts).
"""
