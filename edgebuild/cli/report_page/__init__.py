"""The report page, ``build/index.html`` (``doit report``): what it says (``page.py``)
and how (``templates/``, Jinja2 with autoescaping, shipped as package data)."""

from __future__ import annotations

from edgebuild.cli.report_page.page import PAGE_FILE, render_report_page, write_report_page

__all__ = ["PAGE_FILE", "render_report_page", "write_report_page"]
