"""Evaluation: suites from the eval config, rollouts -> verifier -> metrics,
and the comparison / table helpers of the `jaxdistill.evaluate` command."""
from jaxdistill.evaluation.core import (evaluate_model, evaluate_suites,
                                        rollout_generator, summarize)
from jaxdistill.evaluation.report import (forgetting_metrics, format_report,
                                          group_means, sparsity_metrics)
from jaxdistill.evaluation.suites import load_suites, suite_records
