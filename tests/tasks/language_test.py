"""The style judge on responses written here by hand, in known languages."""
import pytest

pytest.importorskip("langdetect")

from jaxdistill.tasks import language  # pylint: disable=g-import-not-at-top

SPANISH = ("<think>Primero observamos que la fuerza neta sobre el bloque es "
           "cero, por lo tanto la aceleración también debe ser cero. Entonces "
           "la respuesta correcta es la opción B.</think><answer>B</answer>")
ENGLISH = ("<think>First we note that the net force on the block is zero, so "
           "its acceleration must also be zero. Therefore the correct answer "
           "is option B.</think><answer>B</answer>")
# English prose around Spanish-looking neutral parts, and the reverse.
ENGLISH_WITH_LABELS = ("<think>The energy is $E = mc^2$ and `velocidad = 3` "
                       "in the code, so the kinetic term dominates and we "
                       "pick the second option.</think><answer>la "
                       "respuesta es B</answer>")
SPANISH_WITH_MATH = ("<think>Sea $f(x) = x^2 + \\frac{1}{2}$; entonces la "
                     "derivada es $2x$ y el mínimo está en cero, como "
                     "queríamos demostrar.</think><answer>A</answer>")

# The SciKnowEval release's own tags (the teacher's demonstrations).
ENGLISH_IN_REASONING_TAGS = ("<reasoning>The solution is acidic because the "
                             "acid donates protons to the water, lowering the "
                             "pH below seven.</reasoning><answer>C</answer>")


@pytest.mark.parametrize("text,want", [
    (SPANISH, "es"), (ENGLISH, "en"), (ENGLISH_WITH_LABELS, "en"),
    (SPANISH_WITH_MATH, "es"), (ENGLISH_IN_REASONING_TAGS, "en"),
    ("<reasoning></reasoning><answer>C</answer>", None),
    ("<think></think><answer>C</answer>", None),       # tags and a label only
    ("$\\int_0^1 x\\,dx = \\frac{1}{2}$ (A)", None),    # mathematics only
    ("", None),
])
def test_language(text, want):
  assert language.language(text) == want


def test_prose_drops_the_neutral_parts():
  assert language.prose("<think>Hola $x^2$ `code` (A)</think>") == "Hola"
  assert language.prose("<reasoning>Hola</reasoning>") == "Hola"


def test_spanish_fraction():
  assert language.spanish_fraction(
      [SPANISH, ENGLISH, SPANISH_WITH_MATH, "<answer>B</answer>"]) == 0.5
  with pytest.raises(ValueError, match="no responses"):
    language.spanish_fraction([])


def test_missing_langdetect_is_one_line_before_any_generation(monkeypatch):
  import sys  # pylint: disable=g-import-not-at-top
  from jaxdistill import config_lib  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluate import run  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config("configs/eval.py:runlocal")
  c.language = "es"
  run.check_config(c)
  monkeypatch.setitem(sys.modules, "langdetect", None)  # not installed
  with pytest.raises(ImportError, match=r"pip install 'jaxdistill\[style\]'"):
    run.check_config(c)
