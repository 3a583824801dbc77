"""Constrained decoding in the library and the CLI: grammars over the model's vocabulary (llguidance),
the mask in the sampler, and outputs that are valid against their schema, grammar or regex."""
import json
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

import llambda
from llambda.constraints import ConstraintError, GrammarSpec, Grammars, grammar_spec
from llambda.sampling import Sampler, SamplingParams

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pet": {"enum": ["cat", "dog", "none"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}}
QUESTIONS = ["Describe a person as JSON.", "Invent a character for a story.", "Who is your best friend?",
             "Give me a JSON record of a pet owner.", "Tell me about a famous scientist.", "Write a user profile."]


# -- offline ---------------------------------------------------------------------------------

def test_grammar_spec_takes_one_constraint():
    assert grammar_spec() is None
    assert grammar_spec(json_schema={"type": "object"}) == GrammarSpec("json_schema", '{"type": "object"}')
    assert grammar_spec(grammar='root ::= "a"').kind == "grammar"
    assert grammar_spec(regex="[0-9]+") == GrammarSpec("regex", "[0-9]+")
    with pytest.raises(ConstraintError, match="at most one"):
        grammar_spec(json_schema={}, regex="a")
    with pytest.raises(ConstraintError, match="grammar"):
        grammar_spec(grammar="")
    with pytest.raises(ConstraintError, match="json_schema"):
        grammar_spec(json_schema=5)
    with pytest.raises(ConstraintError):
        GrammarSpec("xml", "<a/>")


def _cycle():
    d = {"type": "object"}
    d["properties"] = {"a": d}
    return d


def _nested(depth):
    d = top = {}
    for _ in range(depth):
        d["items"] = d = {}
    return top


@pytest.mark.parametrize("schema", [{"type": {1, 2}}, {"type": object()}, _cycle(), _nested(100_000)],
                         ids=["set", "object", "cycle", "deep"])
def test_a_json_schema_dict_that_is_not_json_is_a_constraint_error(schema):
    # json.dumps raised TypeError, ValueError or RecursionError at the caller
    with pytest.raises(ConstraintError, match="not JSON"):
        grammar_spec(json_schema=schema)


def test_sampler_never_picks_a_banned_token():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=200).astype(np.float32)
    banned = np.ones(200, bool)
    allowed = [3, 77, 150]
    banned[allowed] = False
    greedy = Sampler(SamplingParams(temperature=0)).sample(logits, banned=banned)
    assert greedy.token == allowed[int(np.argmax(logits[allowed]))]
    # the reported logprob is the model's, as with logit_bias: the mask only restricts the choice
    assert greedy.logprob == pytest.approx(float(logits[greedy.token] - np.log(np.exp(logits).sum())), abs=1e-5)
    for params in (SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1),
                   SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=2),
                   SamplingParams(temperature=1.0, top_k=2, top_p=0.5, min_p=0.0, seed=3)):
        s = Sampler(params)
        picks = {s.sample(logits, banned=banned).token for _ in range(300)}
        assert picks <= set(allowed), params
    with pytest.raises(ValueError, match="mask"):
        Sampler(SamplingParams()).sample(logits, banned=banned[:10])


class _SetGrammar:
    """A stand-in grammar over a tiny vocabulary: any token of `allowed`, forever; counts its masks."""

    def __init__(self, n, allowed):
        self.n, self.allowed, self.masks = n, set(allowed), 0

    def start(self):
        return self

    done = False
    accepting = False

    def banned(self):
        self.masks += 1
        return np.array([t not in self.allowed for t in range(self.n)])

    def advance(self, t):
        assert t in self.allowed

    def try_advance(self, t):
        return t in self.allowed


def _draws(params, logits, grammar, n):
    from llambda.engine import GenerationParams, Sequence
    seq = Sequence(None, [0], GenerationParams(max_tokens=None, sampling=params, grammar=grammar), 0, 10**9)
    return np.bincount([seq.step(logits).token for _ in range(n)], minlength=logits.size)


def test_unmasked_first_draw_gives_exactly_the_masked_distribution():
    """Drawing unmasked and falling back to the mask when the grammar refuses the token is rejection
    sampling: the frequencies are the softmax renormalized over the allowed tokens."""
    logits = np.array([2.0, 0.5, 1.5, -1.0, 0.0, 1.0], np.float32)
    allowed = [1, 3, 4, 5]
    g = _SetGrammar(6, allowed)
    n = 20000
    counts = _draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7), logits, g, n)
    p = np.zeros(6)
    p[allowed] = np.exp(logits[allowed]) / np.exp(logits[allowed]).sum()
    assert counts[[0, 2]].sum() == 0
    assert np.abs(counts / n - p).max() < 0.015, (counts / n, p)
    # the mask was needed only when the unmasked draw fell on a refused token (~60% of the mass here)
    refused = np.exp(logits[[0, 2]]).sum() / np.exp(logits).sum()
    assert abs(g.masks / n - refused) < 0.02
    # with truncation the mask comes first: top-k=2 of the allowed tokens, never another
    g = _SetGrammar(6, allowed)
    counts = _draws(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=7), logits, g, 2000)
    assert set(np.flatnonzero(counts)) == {1, 5} and g.masks == 2000
    # greedy: the best allowed token
    counts = _draws(SamplingParams(temperature=0), logits, _SetGrammar(6, allowed), 10)
    assert counts[5] == 10


class ByteVocab:
    """A tokenizer of 256 byte tokens and an EOS: enough for llguidance to compile against, offline."""
    vocab_size, eos_id, bos_id, eot_ids = 257, 256, None, {256}

    def token_bytes(self, i):
        return bytes([i]) if i < 256 else b"<eos>"

    def is_special(self, i):
        return i == 256

    def encode(self, text, parse_special=False):
        return list(text.encode())


def _ref_chain(levels):
    """A schema nesting `levels` objects through $refs: JSON nesting the parser never sees."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["a"]}
            for i in range(levels)}
    return {"$defs": {**defs, f"d{levels}": {"type": "string"}}, "$ref": "#/$defs/d0"}


def _lark_chain(levels):
    """A Lark grammar `levels` deep: each rule refers to the next."""
    rules = [f'a{i:x}: "a" a{i + 1:x}' for i in range(levels)]
    return "\n".join(["start: a0", *rules, f'a{levels:x}: "y"'])


_DEEP = f"""
import sys; sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
from test_constrained import ByteVocab, _lark_chain, _ref_chain
from llambda.constraints import Grammars, GrammarSpec, grammar_spec
try:
    from llambda.constraints import bounds
    bounds.MAX_MASK_CPU_SECONDS = float("inf")    # this is about the stack; a deep grammar's mask is slow
except ImportError:
    pass
g = Grammars(ByteVocab(), 257)
c = g.compile(grammar_spec(json_schema=_ref_chain(1500))).start()
assert (~c.banned()).nonzero()[0].tolist() == [ord("{{")]
c = g.compile(GrammarSpec("lark", _lark_chain(30_000))).start()   # as tools' grammars; < 65k symbols
for t in b"aaaa":
    c.advance(t)
print("compiled")
"""


def test_deep_grammars_compile_without_overflowing_the_stack():
    """1500 objects nested through $refs (110 kB of schema) overflowed the 8 MB stack in
    llguidance's compiler and killed the process (a server, with one request); so did a Lark
    chain of 3000 rules. Compiling runs on a deep stack that holds the deepest grammar llguidance takes."""
    out = subprocess.run([sys.executable, "-c", _DEEP], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["compiled"], (out.returncode, out.stderr[-2000:])


_LIMITED = f"""
import resource, sys; sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
from test_constrained import ByteVocab
from llambda.constraints import Grammars, grammar_spec
g = Grammars(ByteVocab(), 257)
size = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize:")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 256 * 2**20, resource.RLIM_INFINITY))   # no room for 512 MiB
c = g.compile(grammar_spec(regex="ab")).start()
print((~c.banned()).nonzero()[0].tolist())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="limits the address space through /proc and RLIMIT_AS")
def test_compiling_works_where_the_deep_stack_does_not_fit():
    """Under ulimit -v, a thread with a 512 MiB stack cannot start ("can't start new thread"):
    every compile failed. It falls back to a smaller stack."""
    out = subprocess.run([sys.executable, "-c", _LIMITED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["[97]"], (out.returncode, out.stderr[-2000:])


def test_grammars_too_big_to_compile_quickly_are_refused():
    from llambda.constraints.bounds import MAX_GRAMMAR_CHARS
    g = Grammars(ByteVocab(), 257)
    with pytest.raises(ConstraintError, match="at most"):
        g.compile(grammar_spec(regex="a" * (MAX_GRAMMAR_CHARS + 1)))
    # a chain of 2500 GBNF rules (53 kB): llguidance's Python converter took ~30 s, holding the GIL
    n = 2500
    chain = "root ::= r0\n" + "\n".join(f'r{i} ::= r{i + 1} | "x"' for i in range(n)) + f'\nr{n} ::= "y"'
    with pytest.raises(ConstraintError, match="too large to convert.*Lark"):
        g.compile(grammar_spec(grammar=chain))
    from llambda.constraints.bounds import MAX_GBNF_CHARS
    one_rule = "root ::= " + " | ".join(f'"w{i}"' for i in range(MAX_GBNF_CHARS // 6))   # ~10 us a character
    with pytest.raises(ConstraintError, match="too large to convert"):
        g.compile(grammar_spec(grammar=one_rule))
    # a chain of 300 is well within the bound
    n = 300
    chain = "root ::= r0\n" + "\n".join(f'r{i} ::= r{i + 1} | "x"' for i in range(n)) + f'\nr{n} ::= "y"'
    c = g.compile(grammar_spec(grammar=chain)).start()
    assert (~c.banned()).nonzero()[0].tolist() == [ord("x"), ord("y")]
    from llambda.constraints.bounds import MAX_GBNF_CHARS
    one_rule = "root ::= " + " | ".join(f'"w{i}"' for i in range(MAX_GBNF_CHARS // 6))   # ~10 us a character
    with pytest.raises(ConstraintError, match="too large to convert"):
        g.compile(grammar_spec(grammar=one_rule))
    # the same chain in Lark needs no conversion, and compiles
    lark = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} | "x"' for i in range(n)) + f'\nr{n}: "y"'
    c = g.compile(grammar_spec(grammar=lark)).start()
    assert (~c.banned()).nonzero()[0].tolist() == [ord("x"), ord("y")]


def test_a_grammar_that_allows_no_output_is_refused_when_compiled():
    """It compiled, and failed at the first token with llguidance's "NoExtensionBias" and a dump of
    its parser state; now the compile refuses it, saying why."""
    g = Grammars(ByteVocab(), 257)
    for kw in ({"grammar": 'root ::= x\nx ::= x "a"'}, {"json_schema": {"$ref": "#"}},
               {"json_schema": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}):
        with pytest.raises(ConstraintError, match="allows no output") as e:
            g.compile(grammar_spec(**kw))
        assert "Parser" not in str(e.value)
    # inside a larger grammar the dead end is reached while decoding, and said as plainly
    c = g.compile(grammar_spec(grammar='%llguidance {}\nstart: "a" x\nx: %json {"$ref": "#"}')).start()
    c.advance(ord("a"))
    with pytest.raises(ConstraintError, match="no text can continue"):
        c.banned()
    assert g.compile(grammar_spec(json_schema={"$defs": {"n": {"type": "object", "properties": {
        "c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"})).start().try_advance(ord("{"))


def test_boolean_json_schemas():
    """A schema may be a boolean: true allows any value, false none. true was refused with
    llguidance's "Expecting object schema to apply options"."""
    g = Grammars(ByteVocab(), 257)
    c = g.compile(grammar_spec(json_schema=True)).start()
    for b in b'[1, "a"]':
        c.advance(b)
    assert c.accepting
    with pytest.raises(ConstraintError, match="false allows no value"):
        g.compile(grammar_spec(json_schema=False))


def test_a_mask_too_costly_to_compute_is_refused(monkeypatch):
    """llguidance's mask costs ~0.4 us per character of the literal being matched, outside its fuel
    limits: a 200 kB const took 160 ms a token, and on the server every stream waited for it. A mask
    over the CPU budget is refused, at compile (the first mask) or at the token where it happens."""
    from llambda.constraints import bounds
    g = Grammars(ByteVocab(), 257)
    c = g.compile(grammar_spec(regex="ab+")).start()
    assert (~c.banned()).nonzero()[0].tolist() == [ord("a")]
    monkeypatch.setattr(bounds, "MAX_MASK_CPU_SECONDS", -1.0)     # any mask is over: the rule, not a timing
    with pytest.raises(ConstraintError, match="too costly to follow"):
        c.banned()
    with pytest.raises(ConstraintError, match="regex: the grammar is too costly"):
        g.compile(grammar_spec(regex="ab+"))


def test_a_grammar_past_llguidances_limits_on_one_mask_is_refused_naming_them(monkeypatch):
    """llguidance stops a mask that needs too many Earley items while computing it (the CPU cap can
    only follow a mask): the bound is ours, set on every grammar, and the 400 names it, not the
    parser's "Too many items"."""
    from llambda.constraints import bounds
    g = Grammars(ByteVocab(), 257)
    spec = grammar_spec(grammar='start: x\nx: ("a" | "b" y)*\ny: "c"*')
    g.compile(spec)
    monkeypatch.setattr(bounds, "MASK_MAX_ITEMS", 1)
    with pytest.raises(ConstraintError, match=r"grammar: the grammar is too costly to follow: .*step_max_items limit \(1\)"):
        g.compile(spec)


def test_a_steps_masks_over_its_budget_refuse_the_dearest_requests():
    """16 requests whose masks are each just under the one-mask cap would stall every stream 16 times
    as long: the dearest are refused until the rest fit the step's budget, the cheap ones never."""
    from llambda.constraints import bounds
    cap, budget = bounds.MAX_MASK_CPU_SECONDS, bounds.MAX_STEP_MASK_CPU_SECONDS
    costs = {f"hostile{i}": cap * (0.9 + 0.001 * i) for i in range(16)}
    costs.update(cheap=0.001, cheaper=0.0005)
    refused = bounds.to_refuse(costs)
    kept = [k for k in costs if k not in refused]
    assert "cheap" in kept and "cheaper" in kept
    assert sum(costs[k] for k in kept) <= budget
    assert refused == sorted(refused, key=costs.get, reverse=True)     # dearest first
    assert sum(costs[k] for k in kept) + costs[refused[-1]] > budget   # none refused past the budget
    assert bounds.to_refuse({"one request, n=16": 16 * 0.9 * cap}) == ["one request, n=16"]
    assert bounds.to_refuse({"a": budget / 2, "b": budget / 2}) == []
    assert f"at most {budget * 1e3:.0f} ms a step" in bounds.step_budget_exceeded(0.72, 0.8)


def test_a_step_holds_sequences_back_only_past_its_budget_and_after_one_went():
    """StepMasks: once the step's grammar CPU is past its budget the sequences left are held back,
    but never the first (a budget spent by nothing would hold every sequence, every step)."""
    from llambda.constraints import bounds
    m = bounds.StepMasks(2)
    m.add(0.06, "a")
    assert not m.hold() and not m.past(0.04) and m.past(0.05)
    m.add(0.05, "b")
    assert m.hold() and m.to_refuse() == ["a"] and m.spent == m.charged["a"] + m.charged["b"]
    m.add(0.01)                                  # a sequence that ended: spent, charged to no one
    assert m.spent > sum(m.charged.values())
    nothing = bounds.StepMasks(0)
    nothing.budget = -1.0
    assert nothing.past() and not nothing.hold()


def test_a_busy_server_of_ordinary_grammars_fits_the_step_budget():
    """The step's budget grows with its constrained sequences: 32 of the dearest ordinary grammar's
    masks (~5 ms each) are never refused, while 32 just under the one-mask cap still are."""
    from llambda.constraints import bounds
    ordinary = {f"r{i}": 0.005 for i in range(32)}
    assert sum(ordinary.values()) > bounds.MAX_STEP_MASK_CPU_SECONDS
    assert bounds.to_refuse(ordinary, sequences=32) == []
    hostile = {f"h{i}": 0.9 * bounds.MAX_MASK_CPU_SECONDS for i in range(32)}
    refused = bounds.to_refuse(hostile, sequences=32)
    assert refused and sum(hostile[k] for k in hostile if k not in refused) <= bounds.step_budget(32)
    assert "at most 320 ms a step" in bounds.step_budget_exceeded(0.045, 1.44, sequences=32)


# -- on SmolLM2's vocabulary -------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_ctx=512) as m:
        yield m


def test_mask_allows_exactly_the_tokens_that_stay_in_the_grammar(model):
    tok = model.tokenizer
    c = model.compile_grammar(GrammarSpec("regex", "(yes|no|maybe)!")).start()
    allowed = np.flatnonzero(~c.banned())
    words = [b"yes!", b"no!", b"maybe!"]
    for t in allowed:
        piece = tok.token_bytes(int(t))
        assert any(w.startswith(piece) for w in words), piece
    expect = {t for t in range(tok.vocab_size) if tok.token_bytes(t) and not tok.is_special(t)
              and any(w.startswith(tok.token_bytes(t)) for w in words)}
    assert set(allowed.tolist()) == expect
    # EOS only once the text is complete, and then nothing else
    for t in tok.encode("maybe"):
        c.advance(t)
    assert not c.done and not c.accepting
    assert c.banned()[sorted(tok.eot_ids)].all()
    c.advance(tok.encode("!")[0])
    assert c.accepting and c.done
    with pytest.raises(ConstraintError):
        c.advance(tok.encode("x")[0])


def test_invalid_constraints_fail_before_any_token(model):
    cases = [({"json_schema": {"type": "objekt"}}, "objekt"),
             ({"json_schema": {"type": "string", "minLength": 5, "maxLength": 2}}, "maxLength"),
             ({"json_schema": "{not json"}, "JSON"),
             ({"json_schema": '{"items":' * 100_000 + "{}" + "}" * 100_000}, "JSON"),   # was a RecursionError
             ({"grammar": "root ::= undefined_rule"}, "undefined_rule"),
             ({"grammar": 'root ::= "a" ['}, "grammar"),
             ({"regex": "[a-"}, "regex")]
    for kw, word in cases:
        with pytest.raises(ConstraintError, match=word):
            model.stream("Hello", **kw)       # raised at the call, not at the first next()


def test_json_schema_outputs_are_always_valid(model):
    """Many prompts and temperatures, chat and plain completion: every output validates."""
    n = 0
    for i, q in enumerate(QUESTIONS):
        for temp in (0.0, 0.7, 1.3):
            events = list(model.chat_stream([{"role": "user", "content": q}], json_schema=PERSON, temperature=temp,
                                            max_tokens=96, seed=i))
            assert events[-1].finish_reason == "stop", "the grammar ends the output well before max_tokens"
            jsonschema.validate(json.loads("".join(e.text for e in events)), PERSON)
            n += 1
    out = model.complete("A person, as JSON:", json_schema=json.dumps(PERSON), temperature=0.9, max_tokens=96, seed=5)
    jsonschema.validate(json.loads(out), PERSON)
    # generate() yields the ids of the same text
    ids = list(model.generate("Person:", json_schema=PERSON, temperature=0, max_tokens=96))
    jsonschema.validate(json.loads(model.detokenize(ids)), PERSON)
    assert n == len(QUESTIONS) * 3


def test_gbnf_grammar_and_regex(model):
    gbnf = 'root ::= "The answer is " answer "."\nanswer ::= "yes" | "no" | [0-9]+'
    for temp in (0.0, 1.0):
        for seed in range(3):
            out = model.complete("Question: is it raining?\n", grammar=gbnf, temperature=temp, seed=seed,
                                 max_tokens=16)
            assert re.fullmatch(r"The answer is (yes|no|[0-9]+)\.", out), out
    # llguidance's own Lark dialect is taken too
    lark = 'start: "[" ITEM ("," ITEM)* "]"\nITEM: /[a-z]{1,6}/'
    out = model.complete("Fruits:", grammar=lark, temperature=0, max_tokens=30)
    assert re.fullmatch(r"\[[a-z]{1,6}(,[a-z]{1,6})*\]", out), out
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
    for seed in range(3):
        out = model.chat([{"role": "user", "content": "When is the meeting?"}], regex=date, temperature=1.0,
                         seed=seed, max_tokens=16)
        assert re.fullmatch(date, out), out
    # ignore_eos: the grammar may end at "ha", the caller wants more; it never ends before max_tokens
    evs = list(model.stream("Laugh:", regex="( ?ha)+", ignore_eos=True, max_tokens=6, temperature=0))
    assert evs[-1].finish_reason == "length" and sum(e.token >= 0 for e in evs) == 6
    assert re.fullmatch("( ?ha)+", "".join(e.text for e in evs))


def test_constraint_keeps_greedy_text_of_an_allowed_answer(model):
    """A grammar that allows what the model would write anyway changes nothing."""
    free = model.complete("The capital of France is", temperature=0, max_tokens=4)
    fenced = model.complete("The capital of France is", temperature=0, max_tokens=4, regex="(.|\n)*")
    assert free == fenced


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "llambda.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_json_schema_and_grammar(smollm2_gguf, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    out = _cli("run", "-m", str(smollm2_gguf), "--json-schema", str(schema), "--temperature", "0.8", "--seed", "3",
               "-n", "96", "A person as JSON:")
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), PERSON)
    gbnf = tmp_path / "yn.gbnf"
    gbnf.write_text('root ::= "Yes" | "No"\n')
    out = subprocess.run([sys.executable, "-m", "llambda.cli", "chat", "-m", str(smollm2_gguf), "--grammar", str(gbnf),
                          "--temperature", "0", "-n", "8"], input="Is water wet?\n", capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("Yes", "No"), out.stdout
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= nowhere\n")
    out = _cli("run", "-m", str(smollm2_gguf), "--grammar", str(bad), "hi")
    assert out.returncode == 1 and "nowhere" in out.stderr and "Traceback" not in out.stderr
    out = _cli("run", "-m", str(smollm2_gguf), "--grammar", str(gbnf), "--json-schema", str(schema), "hi")
    assert out.returncode == 1 and "at most one" in out.stderr
