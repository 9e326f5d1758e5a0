"""The training objective, one part a file: a contrastive loss and the terms beside it.

==============================  ============================================================================
file                            what it holds
==============================  ============================================================================
:mod:`~obliq.losses.infonce`    :class:`InfoNCE`, the contrastive loss (the paper's Eq. 1), which owns τ
:mod:`~obliq.losses.masks`      the in-batch false negatives by identity key; :func:`check_negatives`
:mod:`~obliq.losses.multipositive`  MIL-NCE and SupCon row losses for rows with several positives
:mod:`~obliq.losses.matryoshka` the loss at nested embedding dimensions
:mod:`~obliq.losses.term`       :class:`Term`, what a term is: name, weight, the batch keys it needs
:mod:`~obliq.losses.teacher`    :class:`TeacherScores`: KL or MarginMSE over a teacher's stored scores
:mod:`~obliq.losses.relational` :class:`Relational`: in-batch relational KL from the teacher's vectors
:mod:`~obliq.losses.guided`     :class:`GuidedMask`: candidates the teacher scores above the positive left out
:mod:`~obliq.losses.view`       :class:`StepView`: the step's batch as all of them read it, gathered or not
==============================  ============================================================================

In a recipe (:class:`obliq.model.RetrieverModule` takes a loss and a list of terms by class path)::

    model:
      loss:
        class_path: obliq.losses.InfoNCE
        init_args: {temperature: 0.05, symmetric: true, multi_positive: mil-nce}
      terms:
        - class_path: obliq.losses.Relational
          init_args: {weight: 0.5}
        - class_path: obliq.losses.GuidedMask
          init_args: {margin: 0.0}

A new term is a :class:`Term` subclass in its own file, exported here, with a test.
"""

from obliq.losses.guided import GuidedMask, guided_mask
from obliq.losses.infonce import InfoNCE, info_nce
from obliq.losses.masks import check_negatives, false_negative_masks, negatives_left
from obliq.losses.matryoshka import matryoshka
from obliq.losses.multipositive import multi_positive_losses
from obliq.losses.relational import Relational, relational_distillation
from obliq.losses.teacher import TeacherScores, teacher_distillation
from obliq.losses.term import Term, check_terms
from obliq.losses.view import StepView, positive_mask

__all__ = [
    "GuidedMask",
    "InfoNCE",
    "Relational",
    "StepView",
    "TeacherScores",
    "Term",
    "check_negatives",
    "check_terms",
    "false_negative_masks",
    "guided_mask",
    "info_nce",
    "matryoshka",
    "multi_positive_losses",
    "negatives_left",
    "positive_mask",
    "relational_distillation",
    "teacher_distillation",
]
