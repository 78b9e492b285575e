"""PRM prefix cache, tensor side: rows over the PRM's paged KV cache give the rewards of
a full recomputation, and the incremental PRM format (head + pieces + closing) is the
whole render token for token.

The block bookkeeping here (``Tree``) plays the lead's PRMCache / BlockManager: a task
computes its new piece(s) + the closing tokens on top of its cached ancestor's prefix;
the child shares the ancestor's full blocks and copies the partial last one
(copy-on-write) before writing into it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_rows import PRMRow
from specscale.engine.text.prm_format import PRMInput

NAMES = ["qwen2_prm", "llama_prm"]
EXACT = 1e-9  # float64: cached vs recomputed differ only by summation order

QUESTIONS = [
    "Alice has 12 apples. Bob gives Alice 5 more apples. How many apples does Alice have now?",
    "What is 3 + 4?",
]
STEPS = [
    "Step 1: We add 12 and 5 to get 12 + 5 = 17.",
    "Step 2: Subtract 5 from 12, so 12 - 5 = 7.",
    "Therefore the total is 7.",
    "The answer is \\boxed{17}.",
    "Let x = 12. Then 2x + 5 = 29, so the value is 29.",
    "x^2 - 5x + 12 = 0 has two roots.",
    "+ - 3",
    "Multiply 12 by 5: 12 * 5 = 60.",
]
TYPICAL_PATHS = [
    STEPS[:2],
    STEPS[1:4],
    STEPS[4:7] + [""],  # an empty step
    ["12 + 5", "(a) 17", "$x$", "\\frac{1}{2}", "17."],
    ["The answer is 7"],
]


@pytest.fixture(scope="module", params=NAMES)
def name(request):
    return request.param


def make_prm(tiny, name, block_size=4, max_batch_tokens=8192, num_blocks=512):
    prm = ProcessRewardModel(tiny[name], dtype=torch.float64, max_batch_tokens=max_batch_tokens)
    prm.allocate_kv_cache(num_blocks, block_size)
    return prm


# ---------------------------------------------------------------------- the search tree
@dataclass
class Node:
    request: int
    steps: tuple[int, ...]  # indices into STEPS, root = ()
    parent: "Node | None"
    prefix: list[int] = field(default_factory=list)  # head + pieces (PRM token ids)
    table: list[int] | None = None  # PRM KV blocks holding the prefix (None = not cached)
    rewards: list[float] = field(default_factory=list)  # per-step rewards of the path

    @property
    def depth(self) -> int:
        return len(self.steps)


class Tree:
    """Paths as pieces, and rows over cached ancestors (stand-in for PRMPaths + PRMCache)."""

    def __init__(self, prm: ProcessRewardModel, pool):
        self.prm, self.fmt, self.pool, self.bs = prm, prm.format, pool, prm.block_size
        self.closing = self.fmt.closing_ids()

    def root(self, request: int) -> Node:
        return Node(request, (), None, self.fmt.head_ids(QUESTIONS[request]))

    def child(self, parent: Node, step: int) -> Node:
        node = Node(parent.request, parent.steps + (step,), parent)
        piece, _ = self.piece(node)
        node.prefix = parent.prefix + piece
        return node

    def piece(self, node: Node) -> tuple[list[int], int]:
        return self.fmt.step_piece(node.depth - 1, self.fmt.content_ids(STEPS[node.steps[-1]]))

    def canonical(self, node: Node) -> PRMInput:
        contents = [self.fmt.content_ids(STEPS[s]) for s in node.steps]
        return self.fmt.encode_pieces(QUESTIONS[node.request], contents)

    def table_after(self, ancestor: Node | None, total: int, copies: list[tuple[int, int]], cow: bool = True):
        """The ancestor's full blocks shared, its partial last block copied (cow) or taken
        over in place, fresh blocks for the rest."""
        if ancestor is None:
            return self.pool.grow([], total, self.bs)
        assert ancestor.table is not None, "the ancestor's prefix is not cached"
        n_cached = len(ancestor.prefix)
        full, partial = divmod(n_cached, self.bs)
        table = list(ancestor.table[:full])
        if partial:
            if cow:
                dst = self.pool.take()
                copies.append((ancestor.table[full], dst))
                table.append(dst)
            else:
                table.append(ancestor.table[full])
        return self.pool.grow(table, total, self.bs)

    def row(self, node: Node, ancestor: Node | None, copies, cow: bool = True) -> PRMRow:
        """Row of ``node`` on top of ``ancestor``'s cached prefix (None: nothing cached):
        the pieces after it, then the closing tokens; rewards at every new piece."""
        chain, n = [], node
        while n is not ancestor and n.depth > 0:
            chain.append(n)
            n = n.parent
        chain.reverse()
        start = len(ancestor.prefix) if ancestor is not None else 0
        ids = [] if ancestor is not None else list(self.root(node.request).prefix)
        positions = []
        for c in chain:
            piece, off = self.piece(c)
            positions.append(len(ids) + off)
            ids.extend(piece)
        ids.extend(self.closing)
        node.table = self.table_after(ancestor, start + len(ids), copies, cow)
        return PRMRow(ids, start, node.table, positions)

    def score(self, rows_of: list[tuple[Node, PRMRow]], copies) -> None:
        """One scheduler round: copy-on-write, then one score_rows call."""
        self.prm.copy_blocks(copies)
        out = self.prm.score_rows([r for _, r in rows_of])
        for (node, row), rewards in zip(rows_of, out):
            assert len(rewards) == len(row.reward_positions)
            base = node.parent.rewards[: node.depth - len(rewards)] if node.parent else []
            node.rewards = base + rewards


def reference(prm: ProcessRewardModel, tree: Tree, nodes: list[Node]) -> list[list[float]]:
    """Full recomputation: no-cache rows over each path's canonical input."""
    inputs = [tree.canonical(n) for n in nodes]
    return prm.score_rows([PRMRow(i.token_ids, 0, None, i.reward_positions) for i in inputs])


def assert_exact(got: list[float], want: list[float], what: str = "") -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert abs(g - w) <= EXACT, f"{what}: {g} vs {w}"


# ---------------------------------------------------------------------- cached == recomputed
@pytest.mark.parametrize("block_size,max_batch_tokens", [(4, 8192), (16, 8192), (4, 48)])
def test_cached_rows_equal_full_recomputation(tiny, block_pool, name, block_size, max_batch_tokens):
    """Two requests on staggered rounds (rows of different path lengths and questions in
    one call), siblings sharing their parent's blocks, a prefix-only row (head, no
    rewards), a depth-1 row that computes its head itself, no-cache rows in the same call,
    and tasks whose parent was evicted (recomputed from an older ancestor)."""
    prm = make_prm(tiny, name, block_size, max_batch_tokens)
    tree = Tree(prm, block_pool(prm.num_kv_blocks, seed=block_size))
    r0, r1 = tree.root(0), tree.root(1)

    # Round 0: request 0 writes its head only (no rewards); request 1 starts with paths
    # of one step whose rows include the head; plus a no-cache whole path.
    copies: list[tuple[int, int]] = []
    a, b = tree.child(r1, 0), tree.child(r1, 4)
    loose = tree.child(tree.child(r0, 7), 2)
    rows = [(a, tree.row(a, None, copies)), (b, tree.row(b, None, copies))]
    head_row = PRMRow(list(r0.prefix), 0, tree.pool.grow([], len(r0.prefix), block_size), [])
    r0.table = list(head_row.block_table)
    tree.score(rows, copies)
    r1.table = a.table  # a's first blocks hold request 1's head: the root's prefix is cached
    loose_ref = tree.canonical(loose)
    out = prm.score_rows([head_row, PRMRow(loose_ref.token_ids, 0, None, loose_ref.reward_positions)])
    assert out[0] == []
    loose.rewards = out[1]

    # Round 1: request 0's first steps (on its cached head), request 1's second steps
    # (two siblings under a, one under b): path lengths 1 and 2 in one call.
    copies = []
    c, d = tree.child(r0, 1), tree.child(r0, 5)
    aa, ab, ba = tree.child(a, 1), tree.child(a, 2), tree.child(b, 5)
    rows = [(n, tree.row(n, n.parent, copies)) for n in (c, aa, d, ab, ba)]
    tree.score(rows, copies)

    # Round 2: depths 2 and 3, a no-cache row mixed in, and evictions: aab recomputes from
    # a (its parent aa "evicted"), bab from request 1's head (a and ba both evicted),
    # dd from nothing cached (start 0 with a fresh table).
    copies = []
    ca, aaa, abb = tree.child(c, 2), tree.child(aa, 3), tree.child(ab, 3)
    aab, bab, dd = tree.child(aa, 6), tree.child(ba, 6), tree.child(d, 6)
    rows = [(n, tree.row(n, n.parent, copies)) for n in (ca, aaa, abb)]
    rows += [(aab, tree.row(aab, a, copies)), (bab, tree.row(bab, r1, copies)), (dd, tree.row(dd, None, copies))]
    assert [len(r.reward_positions) for _, r in rows[3:]] == [2, 3, 2]
    tree.score(rows, copies)

    # Round 3: paths of 4 steps, on top of rows that were themselves recomputed.
    copies = []
    aaaa, aaba, caa = tree.child(aaa, 7), tree.child(aab, 0), tree.child(ca, 3)
    tree.score([(n, tree.row(n, n.parent, copies)) for n in (aaaa, aaba, caa)], copies)

    nodes = [a, b, c, d, aa, ab, ba, ca, aaa, abb, aab, bab, dd, aaaa, aaba, caa, loose]
    for node, want in zip(nodes, reference(prm, tree, nodes)):
        assert_exact(node.rewards, want, f"request {node.request} path {node.steps}")
    flat = [r for n in nodes for r in n.rewards]
    assert max(flat) - min(flat) > 1e-3  # not a constant head


def test_closing_tokens_beyond_a_prefix_are_overwritten(tiny, block_pool, name):
    """A parent's closing tokens sit in its partial last block past its prefix. A child
    that takes that block over in place (no copy) overwrites those slots: its rewards
    equal the recomputation, even with garbage in every slot past the prefix."""
    prm = make_prm(tiny, name, block_size=16)
    tree = Tree(prm, block_pool(prm.num_kv_blocks))
    root = tree.root(0)
    parent = tree.child(root, 0)
    tree.score([(parent, tree.row(parent, None, []))], [])
    assert len(parent.prefix) % prm.block_size, "the test needs a partial last block"

    child = tree.child(parent, 1)
    want = reference(prm, tree, [child])[0]
    row = tree.row(child, parent, [], cow=False)
    assert row.block_table[: len(parent.table)] == parent.table[: len(row.block_table)]
    tree.score([(child, row)], [])
    assert_exact(child.rewards, want, "after the parent's closing tokens")

    # Garbage past the parent's prefix (its closing tokens' slots and beyond): same rewards.
    last = parent.table[len(parent.prefix) // prm.block_size]
    prm.kv_cache.kv[:, :, last, len(parent.prefix) % prm.block_size :] = 1e6
    sibling = tree.child(parent, 1)
    tree.score([(sibling, tree.row(sibling, parent, [], cow=False))], [])
    assert_exact(sibling.rewards, want, "after garbage past the prefix")


def test_mixed_call_keeps_row_order(tiny, block_pool, name):
    """Cached and no-cache rows interleaved in one call: results come back in row order."""
    prm = make_prm(tiny, name)
    tree = Tree(prm, block_pool(prm.num_kv_blocks))
    nodes = [tree.child(tree.root(q), s) for q, s in ((0, 0), (1, 3), (0, 4), (1, 1))]
    rows = []
    for i, n in enumerate(nodes):
        if i % 2:
            inp = tree.canonical(n)
            rows.append(PRMRow(inp.token_ids, 0, None, inp.reward_positions))
        else:
            rows.append(tree.row(n, None, []))
    got = prm.score_rows(rows)
    for g, w in zip(got, reference(prm, tree, nodes)):
        assert_exact(g, w)


def test_score_token_ids_is_score_rows_without_cache(tiny, name):
    prm = make_prm(tiny, name)
    inputs = [prm.format.encode(QUESTIONS[0], p) for p in TYPICAL_PATHS]
    rows = [PRMRow(i.token_ids, 0, None, i.reward_positions) for i in inputs]
    assert prm.score_token_ids(inputs) == prm.score_rows(rows)


# ---------------------------------------------------------------------- KV pool
def test_kv_pool_allocation_and_copies(tiny):
    prm = ProcessRewardModel(tiny["qwen2_prm"], dtype=torch.float32)
    assert prm.kv_cache is None and prm.num_kv_blocks == 0
    prm.copy_blocks([])  # nothing to do, even without a pool
    with pytest.raises(ValueError, match="no KV cache"):
        prm.copy_blocks([(0, 1)])
    with pytest.raises(ValueError, match="row 0 has a block table but the PRM has no KV cache"):
        prm.score_rows([PRMRow([1, 2], 0, [0], [1])])
    prm.allocate_kv_cache(8, 4)
    assert prm.num_kv_blocks == 8 and prm.block_size == 4 and prm.kv_cache.dtype == torch.float32
    assert prm.kv_cache.num_layers == prm.config.num_hidden_layers
    prm.kv_cache.kv[:, :, 2] = 3.0
    prm.copy_blocks([(2, 5), (2, 6)])
    assert (prm.kv_cache.kv[:, :, 5] == 3.0).all() and (prm.kv_cache.kv[:, :, 6] == 3.0).all()
    prm.allocate_kv_cache(3, 16)  # replaced, contents not kept
    assert prm.num_kv_blocks == 3 and prm.block_size == 16 and (prm.kv_cache.kv == 0).all()


# ---------------------------------------------------------------------- errors
def test_row_errors_name_the_row(tiny):
    prm = make_prm(tiny, "qwen2_prm", block_size=4, num_blocks=16)
    ok = PRMRow([1, 2, 3], 0, None, [2])
    window, vocab = prm.max_model_len, prm.config.vocab_size
    cases = [
        (PRMRow([1, 2], window - 1, list(range(16)), [0]), r"row 1 has \d+ tokens .* context window"),
        (PRMRow([1] * (window + 1), 0, None, [0]), r"row 1 has \d+ tokens .* context window"),
        (PRMRow([1, vocab], 0, None, [0]), rf"row 1: token id {vocab} outside the vocabulary"),
        (PRMRow([1, -1], 0, None, [0]), r"row 1: token id -1 outside the vocabulary"),
        (PRMRow([1, 2], 3, None, [0]), r"row 1: start=3 needs a block table"),
        (PRMRow([], 0, None, []), r"row 1 has no new tokens"),
        (PRMRow([1, 2], 0, None, [2]), r"row 1: reward position 2 outside its 2 new tokens"),
        (PRMRow([1, 2], 3, [0], [0]), r"row 1: block table has 1 blocks but 5 tokens need 2"),
        (PRMRow([1, 2], 0, [16], [0]), r"row 1: block id 16 out of range \[0, 16\)"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            prm.score_rows([ok, bad])


# ---------------------------------------------------------------------- incremental format
def pieces_vs_whole(fmt, question, steps):
    return fmt.encode_pieces(question, [fmt.content_ids(s) for s in steps]), fmt.encode(question, steps)


@pytest.mark.parametrize("question", QUESTIONS + ["  leading spaces?", "ends with a newline\n"])
def test_piecewise_equals_whole_encoding(tiny, name, question):
    fmt = make_prm(tiny, name).format
    for steps in TYPICAL_PATHS:
        pieces, whole = pieces_vs_whole(fmt, question, steps)
        assert pieces == whole, (question, steps)


def test_piece_structure(tiny, name):
    """The reward token is where each format reads it; pieces do not depend on the question."""
    fmt = make_prm(tiny, name).format
    content = fmt.content_ids(STEPS[0])
    for index in range(3):
        piece, off = fmt.step_piece(index, content)
        assert 0 <= off < len(piece)
        if name == "qwen2_prm":
            assert piece == content + [fmt.step_token_id] and off == len(piece) - 1
        else:
            assert tuple(piece[len(piece) - len(fmt.header_ids) :]) == fmt.header_ids and off == len(piece) - 1
            if index:
                assert piece[0] == fmt.plus_id and piece[-len(fmt.header_ids) - 1 - len(content) :][: len(content)] == content
    closing = fmt.closing_ids()
    if name == "llama_prm":
        assert closing[0] == fmt.plus_id
    inp = fmt.encode_pieces(QUESTIONS[0], [content])
    assert list(inp.token_ids[-len(closing) :]) == closing
    head = fmt.head_ids(QUESTIONS[0])
    assert list(inp.token_ids[: len(head)]) == head and inp.reward_positions[0] >= len(head)
    with pytest.raises(ValueError, match="at least one step"):
        fmt.encode_pieces(QUESTIONS[0], [])


def test_known_piecewise_differences(tiny):
    """Where piecewise and whole tokenization can differ (piecewise stays canonical):

    * Qwen: a first step starting with a line break. In the whole render "assistant\\n" +
      "\\nStep" is one "\\n\\n" pre-token, piecewise it is "\\n" | "\\n". The tiny tokenizer
      has no "\\n\\n" merge, so the ids still agree here; a real Qwen2.5 tokenizer (which has
      one) gives different ids.
    * RLHFlow (Llama 3 template trims each message's content): ``content_ids`` strips a
      step's text at both ends, but the whole render keeps leading whitespace of step 1
      (it follows the question inside the same turn). Other steps agree."""
    qwen = make_prm(tiny, "qwen2_prm").format
    pre = qwen.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str
    assert [p for p, _ in pre("assistant\n\nStep")] != [p for p, _ in pre("assistant\n")] + [p for p, _ in pre("\nStep")]
    pieces, whole = pieces_vs_whole(qwen, QUESTIONS[0], ["\nStep 1", "two"])
    assert pieces == whole  # tiny vocabulary: no "\n\n" token

    llama = make_prm(tiny, "llama_prm").format
    pieces, whole = pieces_vs_whole(llama, QUESTIONS[0], ["  Step 1", "  two  "])
    assert pieces != whole
    n = len(llama.head_ids(QUESTIONS[0]))
    assert pieces.token_ids[:n] == whole.token_ids[:n]  # only step 1's leading spaces differ
    assert llama.tokenizer.decode(whole.token_ids[n : n + 2]) == "  "  # whole: "q", "  ", "Step"...
    assert pieces == llama.encode_pieces(QUESTIONS[0], [llama.content_ids("Step 1"), llama.content_ids("two")])
