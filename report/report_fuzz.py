#!/usr/bin/python3
"""The report's fuzz target: hypothesis generates evidence shaped around qualify's, verify's and a
replay's keys (and mutations of it: any JSON value in any place, non-finite and huge figures,
lone surrogates, markup in every string, damaged bytes), report.py reads and renders it in this
process, and any exception but the documented refusal fails, as does a page with an element the
renderer did not make (compared with the page of the same evidence with its markup characters
made harmless).

    report_fuzz.py SECONDS    search for SECONDS (tools/fuzz.sh runs it as report_fuzz)
    report_fuzz.py --quick    a few fixed examples (report's test)

Exit 0 when nothing was found, 1 on a finding (printed with the smallest example hypothesis
found), 2 on bad usage.
"""

import atexit
import collections
import html.parser
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402

# What matplotlib's SVG is made of (text is drawn as paths, so it adds no element of its own).
SVG_ELEMENTS = {"svg", "g", "path", "use", "defs", "clippath", "rect", "style", "metadata",
                "rdf:rdf", "cc:work", "cc:agent", "dc:type", "dc:date", "dc:format",
                "dc:creator", "dc:title"}
FORBIDDEN = {"script", "img", "iframe", "object", "embed", "link", "base", "form", "a", "frame",
             "input", "button", "foreignobject", "animate", "set"}
CLASSES = {"", "pass", "fail", "differs", "verdict", "note"}


class Elements(html.parser.HTMLParser):
    """A page's start tags: outside SVG as a multiset, inside SVG as a set of names."""

    def __init__(self, page):
        super().__init__(convert_charrefs=True)
        self.outside, self.inside, self.tags, self.depth = collections.Counter(), set(), [], 0
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs, self.depth > 0 or tag == "svg"))
        if self.depth:
            self.inside.add(tag)
        else:
            self.outside[tag] += 1
        self.depth += tag == "svg"

    def handle_endtag(self, tag):
        if tag == "svg" and self.depth:
            self.depth -= 1


def page_problems(page, twin):
    """What in `page` the renderer did not make: a start tag or attribute that the page of the
    same evidence with harmless text (`twin`) lacks, or one no report page may hold."""
    a, b = Elements(page), Elements(twin)
    problems = []
    if a.outside != b.outside:
        problems.append(f"elements beyond the twin's: {dict(a.outside - b.outside)}, "
                        f"missing: {dict(b.outside - a.outside)}")
    if a.inside != b.inside or not a.inside <= SVG_ELEMENTS:
        problems.append(f"SVG elements {sorted(a.inside)}, the twin's {sorted(b.inside)}")
    for tag, attrs, in_svg in a.tags:
        if tag in FORBIDDEN:
            problems.append(f"a <{tag}> element")
        for name, value in attrs:
            if name.startswith("on"):
                problems.append(f"an {name} attribute on <{tag}>")
            linked = name in ("href", "src", "xlink:href", "action")
            if linked and not (value or "").startswith("#"):
                problems.append(f"<{tag} {name}={value!r}>")
            if name == "class" and not in_svg and value not in CLASSES:
                problems.append(f"<{tag} class={value!r}>")
            if name != "class" and not in_svg and tag != "meta":
                problems.append(f"<{tag} {name}=...> outside the plots")
    return problems


# Markup characters and the harmless characters that stand in for them in the twin (private use
# characters, which the generated text never holds).
HARMLESS = str.maketrans({"<": "\ue000", ">": "\ue001", "&": "\ue002", '"': "\ue003",
                          "'": "\ue004"})


def harmless(value):
    """`value` with every string (keys too) made free of markup characters."""
    if isinstance(value, str):
        return value.translate(HARMLESS)
    if isinstance(value, list):
        return [harmless(v) for v in value]
    if isinstance(value, dict):
        return {harmless(k): harmless(v) for k, v in value.items()}
    return value


def check(data):
    """Reads and renders the evidence `data` (bytes) as report.py does; raises on a finding."""
    try:
        evidence, notes = report.parse(data)
        page = report.page_of(evidence, notes)
    except report.Refused:
        return "refused"
    twin = report.page_of(harmless(evidence), notes)
    problems = page_problems(page, twin)
    assert not problems, "\n".join(problems)
    return "plotted" if "<svg" in page else "rendered"


def strategies():
    """Evidence as hypothesis strategies: the real shapes, each place sometimes anything."""
    from hypothesis import strategies as st

    payloads = ["<script>alert(1)</script>", '"><img src=x onerror=1>', "--><b>", "]]>", "\ud800",
                "$\\frac{$", "inf", "-inf", "nan", "", "_x", "a\nb", "&amp;"]
    words = ["actors", "repeatability", "packing_invariance", "forward_output",
             "gradient_at_output", "gradient_at_input", "incoming_gradient",
             "accumulated_gradient", "pass", "mismatch", "evidence", "as_expected",
             report.REPLAY_FORMAT]
    alphabet = st.characters(blacklist_categories=("Cs",),
                             blacklist_characters="\ue000\ue001\ue002\ue003\ue004")
    text = st.sampled_from(payloads + words) | st.text(alphabet, max_size=20)
    integers = st.integers() | st.integers(-10 ** 1000, 10 ** 1000)
    figures = (st.floats(allow_nan=True, allow_infinity=True) | integers |
               st.sampled_from(["inf", "-inf", "nan"]))
    scalars = st.none() | st.booleans() | integers | figures | text
    anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                            st.dictionaries(text, inner, max_size=4), max_leaves=12)

    def shaped(good):
        # Mostly the real shape, else any value. (Not good | good | good | anything: the
        # strategy's repr, which hypothesis takes, would grow exponentially with the nesting.)
        # Hypothesis favours small integers: 0 is the real shape.
        return st.integers(0, 3).flatmap(lambda i: anything if i == 3 else good)

    def obj(fields, **optional):
        return st.fixed_dictionaries({k: shaped(v) for k, v in fields.items()},
                                     optional={k: shaped(v) for k, v in optional.items()})

    def listed(item, n=4, least=0):
        return shaped(st.lists(shaped(item), min_size=least, max_size=n))

    record = obj({"module": text, "kind": st.sampled_from(words[3:8]) | text},
                 index=st.integers(0, 6) | text, relative_l2=figures, max_tolerance_ratio=figures)
    first = obj({"module": text}, kind=text, index=st.integers(0, 6) | text)
    context = obj({}, digest=text, stable=st.dictionaries(text, anything, max_size=5))
    placement = obj({"name": text}, microbatches=integers | text, reproduced=st.booleans(),
                    differences_from_alone=listed(obj({}, first_module=text, figures=obj(
                        {}, max_abs_diff=figures))))
    # The keys on the way to the plots are always there (then sometimes mutated), so that
    # examples reach them.
    rank_evidence = obj({"records": listed(record, 8, 1), "first_divergence": first},
                        context_a=context, context_b=context,
                        operators=obj({}, diverged=st.booleans(), summary=text),
                        placements=listed(placement))
    rank = obj({"evidence": rank_evidence}, rank=integers, passed=st.booleans(), detail=text)
    check_ = obj({"name": st.sampled_from(words[:3]), "ranks": listed(rank, 3, 1)},
                 passed=st.booleans())
    qualify = obj({"checks": listed(check_)}, passed=st.booleans(), title=text, device=text,
                  topology=obj({}, dp=integers, tp=integers, cp=integers | text),
                  negative_control=text, transport=text, errors=listed(text))
    difference = obj({}, step=integers, rank=integers, path=text, byte_offset=integers,
                     element_index=integers, a=text, b=text, differing_paths=listed(text, 14))
    comparison = obj({}, name=text, steps=st.lists(integers, min_size=2, max_size=2),
                     expected=text, verdict=st.sampled_from(words[8:12]) | text, error=text,
                     first_difference=difference)
    launch = obj({}, name=text, exit_code=integers, error=text, seconds=figures, log=text)
    replay = obj({"format": st.just(report.REPLAY_FORMAT)}, verdict=st.sampled_from(words[8:11]),
                 nproc=integers, steps=integers, resume_step=integers, exit_code=integers,
                 program=listed(text), launches=listed(launch), comparisons=listed(comparison))
    evidence = st.integers(0, 4).flatmap(lambda i: [qualify, replay, qualify, replay, anything][i])
    # The JSON text, sometimes damaged: bytes spliced in (non-UTF-8, a number past Python's int
    # digit limit, deep nesting, the non-standard literals).
    splice = st.sampled_from([b"\xff", b"\xc3", b"1" * 5000, b"[" * 3000, b"NaN", b"-Infinity",
                              b'"\\ud800"', b"}", b","]) | st.binary(max_size=4)
    damage = st.integers(0, 3).flatmap(
        lambda i: st.tuples(st.integers(0, 10 ** 6), splice) if i == 3 else st.none())
    return st.tuples(evidence, damage)


def as_bytes(evidence, damage):
    """The evidence's JSON text (NaN and Infinity literals included), `damage` spliced in."""
    data = json.dumps(evidence).encode()
    if damage is not None:
        at, inserted = damage
        at %= len(data) + 1
        data = data[:at] + inserted + data[at:]
    return data


def main(argv):
    """The command (argv as sys.argv): its exit status."""
    quick = argv[1:] == ["--quick"]
    if not quick and (len(argv) != 2 or not argv[1].isdigit() or int(argv[1]) < 1):
        print("usage: report_fuzz.py SECONDS | --quick", file=sys.stderr)
        return 2
    from hypothesis import HealthCheck, given, settings
    from hypothesis.configuration import set_hypothesis_home_dir

    # Hypothesis keeps a cache (its Unicode tables) in ./.hypothesis unless told: not in the
    # checkout.
    home = os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
    if not home:
        home = tempfile.mkdtemp(prefix="report_fuzz.")
        atexit.register(shutil.rmtree, home, True)
    set_hypothesis_home_dir(home)
    report.STRICT = True  # a section that fails is a finding, not a note on the page
    counts = collections.Counter()

    deadline = time.monotonic() + (0 if quick else int(argv[1]))
    found = []

    @settings(max_examples=150 if quick else 300, derandomize=quick, deadline=None,
              database=None, suppress_health_check=list(HealthCheck), print_blob=True)
    @given(strategies())
    def search(case):
        # Past the time the rest of a batch passes at once, unless a finding is being shrunk.
        if not quick and not found and time.monotonic() > deadline:
            return
        try:
            counts[check(as_bytes(*case))] += 1
        except Exception:
            found.append(case)
            raise

    started = time.monotonic()
    try:
        search()
        while time.monotonic() < deadline:
            search()  # another batch, from a fresh random seed, until the time is up
    except Exception as e:  # noqa: BLE001  (the finding)
        traceback.print_exc(file=sys.stdout)  # with the smallest example, in the notes
        print(f"report_fuzz: FAILED after {sum(counts.values())} examples: "
              f"{type(e).__name__}: {str(e)[:2000]}")
        return 1
    print(f"report_fuzz: PASSED: {sum(counts.values())} examples in "
          f"{time.monotonic() - started:.0f} s ({dict(counts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
