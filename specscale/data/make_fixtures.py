"""Write the bundled fixture datasets (``specscale/data/fixtures/*.jsonl``).

The problems are made up for this project (simple arithmetic and algebra), not
copied from any benchmark. Each file follows the column layout of the dataset it
stands in for (see ``schemas``), so the fixtures run through exactly the loader
code used for the real data. Regenerate with

    python -m specscale.data.make_fixtures

(a test checks the checked-in files equal what this module writes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures"

# GSM8K layout: question, answer = worked solution with <<calc>> notes + "#### N".
GSM8K_ROWS: list[dict[str, Any]] = [
    {"question": "A baker makes 24 muffins in the morning and 18 in the afternoon. He sells 30 of them. How many muffins are left?",
     "answer": "He makes 24 + 18 = <<24+18=42>>42 muffins.\nAfter selling, 42 - 30 = <<42-30=12>>12 are left.\n#### 12"},
    {"question": "Lena reads 15 pages every day. How many pages does she read in 2 weeks?",
     "answer": "Two weeks have 2 * 7 = <<2*7=14>>14 days.\nShe reads 15 * 14 = <<15*14=210>>210 pages.\n#### 210"},
    {"question": "A box holds 6 pencils. A teacher buys 9 boxes and gives away 20 pencils. How many pencils does she keep?",
     "answer": "She buys 6 * 9 = <<6*9=54>>54 pencils.\nShe keeps 54 - 20 = <<54-20=34>>34 pencils.\n#### 34"},
    {"question": "Tom earns $12 per hour and works 35 hours a week. How much does he earn in a week?",
     "answer": "He earns 12 * 35 = <<12*35=420>>420 dollars.\n#### 420"},
    {"question": "A farm has 3 times as many chickens as cows. There are 14 cows. How many animals are there in total?",
     "answer": "There are 3 * 14 = <<3*14=42>>42 chickens.\nIn total 42 + 14 = <<42+14=56>>56 animals.\n#### 56"},
    {"question": "A garden is 8 meters long and 5 meters wide. Fencing costs $7 per meter. How much does it cost to fence the whole garden?",
     "answer": "The perimeter is 2 * (8 + 5) = <<2*(8+5)=26>>26 meters.\nThe fence costs 26 * 7 = <<26*7=182>>182 dollars.\n#### 182"},
    {"question": "Maria had 250 stickers. She gave a fifth of them to her brother and then bought 40 more. How many stickers does she have now?",
     "answer": "She gave away 250 / 5 = <<250/5=50>>50 stickers.\nShe had 250 - 50 = <<250-50=200>>200 left, then 200 + 40 = <<200+40=240>>240.\n#### 240"},
    {"question": "A train travels at 90 kilometers per hour for 3 hours, then at 60 kilometers per hour for 2 hours. How far does it travel?",
     "answer": "First part: 90 * 3 = <<90*3=270>>270 km.\nSecond part: 60 * 2 = <<60*2=120>>120 km.\nTotal: 270 + 120 = <<270+120=390>>390 km.\n#### 390"},
    {"question": "A school orders 1,250 notebooks and 780 folders. How many items does it order?",
     "answer": "It orders 1250 + 780 = <<1250+780=2030>>2030 items.\n#### 2,030"},
    {"question": "An adult ticket costs $8 and a child ticket costs half as much. A family buys 4 adult tickets and 3 child tickets. How much do they pay?",
     "answer": "Adult tickets: 4 * 8 = <<4*8=32>>32 dollars.\nA child ticket costs 8 / 2 = <<8/2=4>>4 dollars, so 3 * 4 = <<3*4=12>>12 dollars.\nTotal: 32 + 12 = <<32+12=44>>44 dollars.\n#### 44"},
    {"question": "Sam saves $15 each week. How many weeks does he need to save $180?",
     "answer": "He needs 180 / 15 = <<180/15=12>>12 weeks.\n#### 12"},
    {"question": "A recipe uses 3 eggs for every 2 cakes. How many eggs are needed for 10 cakes?",
     "answer": "10 cakes are 10 / 2 = <<10/2=5>>5 batches.\nThey need 5 * 3 = <<5*3=15>>15 eggs.\n#### 15"},
    {"question": "The temperature was -4 degrees in the morning and rose by 11 degrees by noon. What was the temperature at noon?",
     "answer": "At noon it was -4 + 11 = <<-4+11=7>>7 degrees.\n#### 7"},
    {"question": "A car uses 6 liters of fuel per 100 kilometers. How many liters does it use on a 450 kilometer trip?",
     "answer": "The trip is 450 / 100 = <<450/100=4.5>>4.5 hundreds of km.\nIt uses 4.5 * 6 = <<4.5*6=27>>27 liters.\n#### 27"},
]


def _math(n: int, folder: str, subject: str, level: int, problem: str, solution: str, answer: str) -> dict[str, Any]:
    return {"problem": problem, "solution": solution, "answer": answer, "subject": subject,
            "level": level, "unique_id": f"fixture/{folder}/{n}.json"}


# MATH-500 layout: problem, solution (ends in \boxed{}), answer, subject, level, unique_id.
MATH500_ROWS: list[dict[str, Any]] = [
    _math(1, "algebra", "Algebra", 1, "Solve for $x$: $3x - 7 = 11$.",
          "Adding 7 to both sides gives $3x = 18$, so $x = \\boxed{6}$.", "6"),
    _math(2, "prealgebra", "Prealgebra", 2, "What is $\\frac{1}{2} + \\frac{1}{3}$?",
          "With the common denominator 6, the sum is $\\frac{3}{6} + \\frac{2}{6} = \\boxed{\\frac{5}{6}}$.", "\\frac{5}{6}"),
    _math(3, "number_theory", "Number Theory", 2, "What is the remainder when $2^{10}$ is divided by $7$?",
          "$2^{10} = 1024 = 7 \\cdot 146 + 2$, so the remainder is $\\boxed{2}$.", "2"),
    _math(4, "counting_and_probability", "Counting & Probability", 2,
          "In how many ways can 3 of 5 different books be placed in order on a shelf?",
          "There are $5 \\cdot 4 \\cdot 3 = \\boxed{60}$ ordered choices.", "60"),
    _math(5, "algebra", "Algebra", 3, "Find the sum of the roots of $x^2 - 5x + 6 = 0$.",
          "The roots are $2$ and $3$, whose sum is $\\boxed{5}$.", "5"),
    _math(6, "geometry", "Geometry", 2, "A right triangle has legs of length 6 and 8. How long is its hypotenuse?",
          "By Pythagoras the hypotenuse is $\\sqrt{36 + 64} = \\boxed{10}$.", "10"),
    _math(7, "intermediate_algebra", "Intermediate Algebra", 3,
          "Find all real $x$ with $x^2 < 4$. Express your answer in interval notation.",
          "$x^2 < 4$ means $|x| < 2$, that is $x \\in \\boxed{(-2, 2)}$.", "(-2, 2)"),
    _math(8, "precalculus", "Precalculus", 1, "Compute $\\cos 60^\\circ$.",
          "From the 30-60-90 triangle, $\\cos 60^\\circ = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    _math(9, "algebra", "Algebra", 2, "Write $\\sqrt{50}$ in simplest radical form.",
          "$\\sqrt{50} = \\sqrt{25 \\cdot 2} = \\boxed{5\\sqrt{2}}$.", "5\\sqrt{2}"),
    _math(10, "prealgebra", "Prealgebra", 1, "What percent of 80 is 20?",
          "$\\frac{20}{80} = \\frac{1}{4}$, which is $\\boxed{25\\%}$.", "25\\%"),
    _math(11, "algebra", "Algebra", 2, "Solve $x^2 = 9$. Enter all solutions, separated by commas.",
          "Taking square roots, $x = \\boxed{-3, 3}$.", "-3, 3"),
    _math(12, "number_theory", "Number Theory", 1, "What is the greatest common divisor of 84 and 120?",
          "$84 = 2^2 \\cdot 3 \\cdot 7$ and $120 = 2^3 \\cdot 3 \\cdot 5$, so the gcd is $2^2 \\cdot 3 = \\boxed{12}$.", "12"),
]


def _olympiad(
    n: int, question: str, solution: str, final_answer: list[str], answer_type: str,
    subfield: str, context: str | None = None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"id": 9000 + n, "question": question, "solution": [solution],
                           "final_answer": final_answer, "context": context}
    row.update({f"image_{k}": None for k in range(1, 6)})
    row.update({"modality": "Text-only", "difficulty": "Competition",
                "is_multiple_answer": len(final_answer) > 1, "unit": None, "answer_type": answer_type,
                "error": None, "question_type": "Open-ended", "subfield": subfield,
                "subject": "Math", "language": "English"})
    return row


# OlympiadBench layout (OE_TO_maths_en_COMP): final_answer is a list of $...$ strings.
OLYMPIADBENCH_ROWS: list[dict[str, Any]] = [
    _olympiad(1, "Find the smallest positive integer $n$ such that $n!$ is divisible by $1000$.",
              "We need three factors of 5; the first factorial with three is $15!$.", ["$15$"], "Numerical", "Number Theory"),
    _olympiad(2, "Compute the sum of all positive divisors of $36$.",
              "The divisors are 1, 2, 3, 4, 6, 9, 12, 18, 36, with sum 91.", ["$91$"], "Numerical", "Number Theory"),
    _olympiad(3, "Find all real numbers $x$ such that $x^2 - 3x + 2 = 0$.",
              "The polynomial factors as $(x-1)(x-2)$.", ["$1$", "$2$"], "Numerical", "Algebra"),
    _olympiad(4, "Let $f(x) = 2x + 3$. Compute $f(f(1))$.",
              "$f(1) = 5$ and $f(5) = 13$.", ["$13$"], "Numerical", "Algebra"),
    _olympiad(5, "Determine the number of positive integers less than $100$ that are divisible by $3$ or $5$.",
              "By inclusion-exclusion: $33 + 19 - 6 = 46$.", ["$46$"], "Numerical", "Combinatorics"),
    _olympiad(6, "Compute $\\log_2 64 + \\log_3 81$.",
              "$\\log_2 64 = 6$ and $\\log_3 81 = 4$.", ["$10$"], "Numerical", "Algebra"),
    _olympiad(7, "A sequence satisfies $a_1 = 1$ and $a_{n+1} = a_n + 2n$ for $n \\geq 1$. Compute $a_{10}$.",
              "By induction $a_n = n^2 - n + 1$, so $a_{10} = 91$.", ["$91$"], "Numerical", "Algebra"),
    _olympiad(8, "Determine all real $x$ for which $|x - 1| \\leq 3$.",
              "The inequality means $-3 \\leq x - 1 \\leq 3$.", ["$[-2, 4]$"], "Interval", "Algebra"),
    _olympiad(9, "Compute the area of the triangle with vertices $(0,0)$, $(4,0)$ and $(0,6)$.",
              "It is a right triangle with legs 4 and 6, so the area is 12.", ["$12$"], "Numerical", "Geometry"),
    _olympiad(10, "Find the ordered pair $(a, b)$ of integers with $a + b = 7$ and $a - b = 3$.",
              "Adding the equations gives $2a = 10$.", ["$(5, 2)$"], "Tuple", "Algebra"),
    _olympiad(11, "Two fair six-sided dice are rolled. Compute the probability that the sum is $7$.",
              "Six of the 36 outcomes have sum 7.", ["$\\frac{1}{6}$"], "Numerical", "Combinatorics"),
    _olympiad(12, "Compute $k^3 - k$.",
              "$64 - 4 = 60$.", ["$60$"], "Numerical", "Algebra", context="Let $k = 4$."),
]

FIXTURES: dict[str, list[dict[str, Any]]] = {
    "gsm8k.jsonl": GSM8K_ROWS,
    "math500.jsonl": MATH500_ROWS,
    "olympiadbench.jsonl": OLYMPIADBENCH_ROWS,
}


def render_jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_fixtures(out_dir: Path = FIXTURE_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, rows in FIXTURES.items():
        path = out_dir / filename
        path.write_text(render_jsonl(rows), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_fixtures():
        print(written_path)
