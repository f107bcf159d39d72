"""Execute examples/notebook/campaign.ipynb with nbclient and say what each cell showed.

Shared by tests/test_notebook.py (this Python, a stub scheduler) and the cluster test (the
test user's venv, real Slurm), which runs this file as a script: ``python notebook_run.py NB OUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List


def execute(notebook: Path, out: Path, cwd: Path, timeout: int = 600) -> None:
    import nbclient
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    nbformat.write(nb, str(out))


def shown(executed: Path) -> List[Dict[str, Any]]:
    """Per code cell: its source, its text/plain, text/html and stream outputs."""
    nb = json.loads(executed.read_text())
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        text, html = [], []
        for o in cell["outputs"]:
            if o["output_type"] == "stream":
                text.append("".join(o["text"]))
            elif o["output_type"] in ("execute_result", "display_data"):
                text.append("".join(o["data"].get("text/plain", "")))
                html.append("".join(o["data"].get("text/html", "")))
            elif o["output_type"] == "error":
                text.append(f"ERROR {o['ename']}: {o['evalue']}")
        cells.append({"source": "".join(cell["source"]), "text": "\n".join(text), "html": "\n".join(html)})
    return cells


if __name__ == "__main__":
    execute(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[2]).parent)
