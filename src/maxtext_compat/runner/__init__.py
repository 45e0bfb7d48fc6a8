"""The compat matrix runner: build each environment of compat_matrix.yaml, run a workspace's tests in it, report.

`envs` builds the environments (`pinsets`: the pin sets; `selfwheel`: this checkout as a wheel; `workspace`: a
project's checkout and its state), `running` runs the suites (`memory` and `durations`: which start when, from
the recorded peaks and seconds), `caches` names every cache path, `nox` hands the same environments to a noxfile.
"""
