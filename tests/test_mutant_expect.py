"""make mutants' ``# expect:`` rule (grading/tools/mutants.py), on made-up mutants (not graded)."""

from __future__ import annotations

from grading.tools.mutants import names_it, parse_mutant

MUTANT = """# the scale forgotten
# expect: forgot the 1/sqrt(d) scale
<<<<<<< find
    a = 1
=======
    a = 2
>>>>>>> replace
"""


def test_a_mutant_s_expected_words_are_read_and_not_taken_for_its_description(tmp_path):
    path = tmp_path / "m.mutant"
    path.write_text(MUTANT)
    mutant = parse_mutant(path, "lab-00")
    assert (mutant.description, mutant.expect) == ("the scale forgotten",
                                                   "forgot the 1/sqrt(d) scale")


def test_the_words_are_found_across_pytest_s_line_breaks_and_case():
    output = ("E       AssertionError: SDPA out is wrong: Forgot the 1/sqrt(d)\n"
              "E         scale\nFAILED test_x")
    assert names_it(output, "forgot the 1/sqrt(d) scale")
    assert not names_it("E   AssertionError: out differs from the float64 reference",
                        "forgot the 1/sqrt(d) scale")
