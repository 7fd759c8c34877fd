"""``doit report``: write ``build/index.html``, every artifact with its state, checks and
figures (``report_page/``); builds and verifies nothing."""

from __future__ import annotations

from edgebuild.cli.common import WorkspaceCommand


class Report(WorkspaceCommand):
    name = "report"
    doc_purpose = "write build/index.html: every artifact, its state, its checks and plots"
    doc_usage = ""
    doc_description = "One static page beside the manifest; builds and verifies nothing (run `doit verify` first)."

    def run(self, workspace, params, args):  # noqa: D102
        from edgebuild.cli.report_page import write_report_page

        path = write_report_page(workspace)
        workspace.save_caches()
        print(path)
        return 0
