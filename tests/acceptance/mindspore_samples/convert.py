"""Copy MindSpore's sample scripts with only their import lines changed (mindspore -> tessel)."""

import pathlib
import re
import sys

src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
lines = src.read_text().splitlines(keepends=True)
out = []
changed = 0
for line in lines:
    s = line.lstrip()
    if s.startswith(("import mindspore", "from mindspore")):
        new = re.sub(r"^(\s*)import mindspore(\s*)$", r"\1import tessel as mindspore\2", line)
        new = re.sub(r"\bmindspore\b", "tessel", new) if "import tessel as mindspore" not in new else new
        changed += new != line
        out.append(new)
    else:
        out.append(line)
dst.parent.mkdir(parents=True, exist_ok=True)
dst.write_text("".join(out))
print(dst, changed)
