#!/usr/bin/env python3
"""Checks that an HTML report (trainyard compare's report.html) fits the page at some widths.

  check_report_layout.py REPORT_HTML [--widths 1000,1600] [--chromium PATH]

For each width the page is loaded in headless Chromium and checked for:
  (a) horizontal scrolling: the document is wider than the window;
  (b) clipped columns: a table cell (th or td) whose right (or left) edge lies outside its
      table's visible box: the window, narrowed by every ancestor whose overflow-x is not
      `visible`. Strict on purpose: a column that is reachable only by scrolling a box with
      overflow-x:auto counts as clipped too;
  (c) overflowing text: a table cell whose content is wider than the cell
      (scrollWidth > clientWidth + 1).

Prints one line per width, "1000 px: ok" or "1000 px: <problems>", and exits 0 when every
width passes, 1 when one does not, 2 on a usage error or when Chromium is missing or could not
measure the page (one line on stderr).

How: a temporary copy of the page gets a <script> before </body> that measures the layout once
the page has loaded and writes the result as JSON into a <pre id="layout-check-result">;
Chromium's --dump-dom prints the page after the script ran, and the JSON is read back from it
(the trick tools/bench/pipeline_bench.py's page_height() uses). The report itself is not
touched. Plain Python 3, standard library only.
"""

import argparse
import html
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_WIDTHS = "1000,1600"
WINDOW_HEIGHT = 900
CHROMIUM_TIMEOUT_S = 60
RESULT_ID = "layout-check-result"
MAX_COLUMNS_LISTED = 4  # per table and kind of problem; the rest are counted

# Runs in the page once it has loaded. Collects, for the window's width:
#   innerWidth, scrollWidth: the window's and the document's widths;
#   clipped: per cell outside its table's visible box, the table, the column and the edges;
#   overflowing: per cell whose text is wider than the cell, the table, column and widths.
# Then writes them as JSON into a <pre> appended to the body (after measuring, so it cannot
# change what was measured).
MEASURE_SCRIPT = r"""
<script>
(function () {
  // The horizontal extent [left, right] the table's cells may occupy: the window, narrowed by
  // each ancestor that clips or scrolls (overflow-x other than visible), at its padding box.
  function visibleBox(table) {
    var box = {left: 0, right: window.innerWidth};
    for (var a = table.parentElement; a && a !== document.documentElement; a = a.parentElement) {
      if (a === document.body) continue;  // the body's overflow propagates to the window
      if (getComputedStyle(a).overflowX === 'visible') continue;
      var r = a.getBoundingClientRect();
      var left = r.left + a.clientLeft;
      box.left = Math.max(box.left, left);
      box.right = Math.min(box.right, left + a.clientWidth);
    }
    return box;
  }
  // What the report calls a table: its caption, else its id, else its first heading cell.
  function tableName(table) {
    if (table.caption && table.caption.textContent.trim()) return table.caption.textContent.trim();
    if (table.id) return 'table#' + table.id;
    var th = table.querySelector('th');
    return th ? 'table "' + th.textContent.trim() + '"' : 'table ' + tableIndex(table);
  }
  function tableIndex(table) {
    return Array.prototype.indexOf.call(document.querySelectorAll('table'), table) + 1;
  }
  // The first column index of each cell of `row`, colspans counted.
  function columnStarts(row) {
    var starts = [], column = 0;
    for (var i = 0; i < row.cells.length; i++) {
      starts.push(column);
      column += row.cells[i].colSpan || 1;
    }
    return starts;
  }
  // The heading text of each column: the table's first row (colspans repeated).
  function headings(table) {
    var out = [];
    if (!table.rows.length) return out;
    var row = table.rows[0];
    for (var i = 0; i < row.cells.length; i++) {
      var text = row.cells[i].textContent.trim().replace(/\s+/g, ' ');
      for (var s = 0; s < (row.cells[i].colSpan || 1); s++) out.push(text);
    }
    return out;
  }
  // A column's heading; its number when the heading row has none for it.
  function columnName(names, index) {
    return names[index] || String(index + 1);
  }
  function measure() {
    var result = {
      innerWidth: window.innerWidth,
      scrollWidth: document.documentElement.scrollWidth,
      clipped: [],
      overflowing: []
    };
    var tables = document.querySelectorAll('table');
    for (var t = 0; t < tables.length; t++) {
      var table = tables[t], box = visibleBox(table), names = headings(table);
      for (var r = 0; r < table.rows.length; r++) {
        var row = table.rows[r], starts = columnStarts(row);
        for (var c = 0; c < row.cells.length; c++) {
          var cell = row.cells[c], rect = cell.getBoundingClientRect();
          if (rect.width === 0 && rect.height === 0) continue;  // not displayed
          var column = columnName(names, starts[c]);
          var lastColumn = columnName(names, starts[c] + (cell.colSpan || 1) - 1);
          if (rect.right > box.right + 0.5 || rect.left < box.left - 0.5) {
            result.clipped.push({table: tableName(table), column: column, lastColumn: lastColumn,
                                 left: Math.round(rect.left), right: Math.round(rect.right),
                                 boxLeft: Math.round(box.left), boxRight: Math.round(box.right)});
          }
          if (cell.scrollWidth > cell.clientWidth + 1) {
            result.overflowing.push({table: tableName(table), column: column,
                                     lastColumn: lastColumn,
                                     text: cell.textContent.trim().slice(0, 40),
                                     scrollWidth: cell.scrollWidth,
                                     clientWidth: cell.clientWidth});
          }
        }
      }
    }
    var pre = document.createElement('pre');
    pre.id = '__RESULT_ID__';
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
  if (document.readyState === 'complete') measure();
  else window.addEventListener('load', measure);
})();
</script>
""".replace("__RESULT_ID__", RESULT_ID)


class CannotCheck(Exception):
    """A bad argument, a missing report or Chromium, or a Chromium run that measured nothing:
    exit 2 with its one-line message."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit status 2)."""

    def error(self, message):
        raise CannotCheck(message)


def parse_arguments(argv):
    parser = OneLineParser(description="Checks that an HTML report's tables fit the page.")
    parser.add_argument("report", metavar="REPORT_HTML")
    parser.add_argument("--widths", default=DEFAULT_WIDTHS,
                        help="comma-separated window widths in px (default %(default)s)")
    parser.add_argument("--chromium", default=DEFAULT_CHROMIUM,
                        help="the Chromium binary (default %(default)s)")
    return parser.parse_args(argv)


def parse_widths(text):
    """'1000,1600' as [1000, 1600]; a CannotCheck unless each is a positive integer."""
    widths = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) <= 0:
            raise CannotCheck(f"--widths: '{text}' is not a comma-separated list of positive "
                             "integers")
        widths.append(int(part))
    return widths


def find_chromium(path):
    """The Chromium binary to run: `path` itself, or looked up on PATH; else a CannotCheck."""
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    found = shutil.which(path)
    if found:
        return found
    raise CannotCheck(f"chromium not found: {path}")


def read_report(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as error:
        raise CannotCheck(f"cannot read {path}: {error.strerror}") from None


def instrumented(page, report_dir):
    """The page with the measuring script before its </body>, and a <base> naming the report's
    folder so that anything it refers to relatively still loads from the temporary copy."""
    base = f'<base href="{html.escape(pathlib.Path(report_dir).resolve().as_uri())}/">'
    page = re.sub(r"<head[^>]*>", lambda m: m.group(0) + base, page, count=1, flags=re.I)
    at = page.lower().rfind("</body>")
    if at < 0:
        return page + MEASURE_SCRIPT
    return page[:at] + MEASURE_SCRIPT + page[at:]


def dump_dom(chromium, page_file, width, profile):
    """The DOM Chromium printed for `page_file` in a window `width` px wide; a CannotCheck when
    it fails or takes longer than CHROMIUM_TIMEOUT_S."""
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{WINDOW_HEIGHT}",
               "--virtual-time-budget=2000", "--dump-dom",
               pathlib.Path(page_file).resolve().as_uri()]
    try:
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CannotCheck(f"chromium took over {CHROMIUM_TIMEOUT_S} s at {width} px") from None
    except OSError as error:
        raise CannotCheck(f"cannot run {chromium}: {error.strerror}") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise CannotCheck(f"chromium exited with {result.returncode} at {width} px: {last}")
    return result.stdout


def read_measurement(dom, width):
    """The JSON the measuring script left in the dumped DOM."""
    match = re.search(rf'<pre id="{RESULT_ID}">(.*?)</pre>', dom, flags=re.S)
    if not match:
        raise CannotCheck(f"the page wrote no layout measurement at {width} px")
    return json.loads(html.unescape(match.group(1)))


def measure(chromium, page, report_dir, width, workdir):
    """The layout measurement of `page` in a window `width` px wide."""
    page_file = os.path.join(workdir, f"measure-{width}.html")
    with open(page_file, "w", encoding="utf-8") as f:
        f.write(instrumented(page, report_dir))
    profile = os.path.join(workdir, f"profile-{width}")
    return read_measurement(dump_dom(chromium, page_file, width, profile), width)


def by_table_and_column(entries):
    """`entries` grouped per table, each column (or span of columns) once, by its first entry,
    in page order."""
    tables = {}
    for entry in entries:
        columns = tables.setdefault(entry["table"], {})
        columns.setdefault((entry["column"], entry["lastColumn"]), entry)
    return tables


def listed(items):
    """The first MAX_COLUMNS_LISTED items joined, and how many more there are."""
    text = ", ".join(items[:MAX_COLUMNS_LISTED])
    if len(items) > MAX_COLUMNS_LISTED:
        text += f" (and {len(items) - MAX_COLUMNS_LISTED} more)"
    return text


def column_text(entry):
    """"column 'peak mem'", or for a cell spanning several "columns 'step ms' to 'numerics'"."""
    if entry["lastColumn"] != entry["column"]:
        return f"columns '{entry['column']}' to '{entry['lastColumn']}'"
    return f"column '{entry['column']}'"


def clipped_problems(clipped):
    """One problem per table with clipped cells, naming each such column and the edge that
    crossed its visible box."""
    problems = []
    for table, columns in by_table_and_column(clipped).items():
        items = []
        for e in columns.values():
            if e["right"] > e["boxRight"]:
                where = f"right edge {e['right']} > {e['boxRight']}"
            else:
                where = f"left edge {e['left']} < {e['boxLeft']}"
            items.append(f"{column_text(e)} ({where})")
        problems.append(f"clipped: {table}: {listed(items)}")
    return problems


def overflow_problems(overflowing):
    """One problem per table whose cells' text is wider than the cells."""
    problems = []
    for table, columns in by_table_and_column(overflowing).items():
        items = [f"{column_text(e)} ('{e['text']}' {e['scrollWidth']} > {e['clientWidth']})"
                 for e in columns.values()]
        problems.append(f"text overflows its cell: {table}: {listed(items)}")
    return problems


def problems_of(measurement):
    """Everything wrong with one width's measurement, as short phrases; empty when it fits."""
    problems = []
    if measurement["scrollWidth"] > measurement["innerWidth"]:
        problems.append(f"page scrolls horizontally (width {measurement['scrollWidth']} > "
                        f"{measurement['innerWidth']})")
    problems += clipped_problems(measurement["clipped"])
    problems += overflow_problems(measurement["overflowing"])
    return problems


def check(report, widths, chromium):
    """Prints a line per width; True when every width passes."""
    page = read_report(report)
    report_dir = os.path.dirname(os.path.abspath(report))
    passed = True
    with tempfile.TemporaryDirectory(prefix="report-layout-") as workdir:
        for width in widths:
            problems = problems_of(measure(chromium, page, report_dir, width, workdir))
            print(f"{width} px: " + ("; ".join(problems) if problems else "ok"), flush=True)
            passed = passed and not problems
    return passed


def main(argv):
    try:
        args = parse_arguments(argv)
        widths = parse_widths(args.widths)
        chromium = find_chromium(args.chromium)
        if not os.path.isfile(args.report):
            raise CannotCheck(f"no such report: {args.report}")
        return 0 if check(args.report, widths, chromium) else 1
    except CannotCheck as error:
        print(f"check_report_layout.py: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
