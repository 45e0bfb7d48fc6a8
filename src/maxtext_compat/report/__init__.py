"""The compat report as a page: MaxText releases x tpu-inference ranges x jax, each cell coloured by what was proven.

`maxtext-compat matrix` writes build/compat-report.html beside the .md and .json (report.results.write_reports), with a
screenshot taken by headless Chromium when it is installed; `make docs` puts the same page into the site.
Modules: evidence (what each environment proved, from its junit file), grid (the cells, from the results and the
matrix), html (the self-contained page), plots (the benchmark figures, matplotlib), browser (headless Chromium),
page (writing it all). Nothing here imports jax or MaxText.
"""
