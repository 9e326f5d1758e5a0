"""The training objective, one part a file: the main loss and the terms beside it.

==================================  ========================================================================
file                                what it holds
==================================  ========================================================================
:mod:`~obliq.losses.loss`           :class:`Loss`, what a main loss is: the protocol the training module asks
:mod:`~obliq.losses.infonce`        :class:`InfoNCE`, the contrastive loss (the paper's Eq. 1), which owns τ
:mod:`~obliq.losses.multipositive`  :class:`MILNCE` and :class:`SupCon`: InfoNCE for rows with several positives
:mod:`~obliq.losses.symmetric`      :class:`Symmetric`: an InfoNCE and its reverse direction (passage↔passage)
:mod:`~obliq.losses.matryoshka`     :class:`Matryoshka`: any loss at nested embedding dimensions
:mod:`~obliq.losses.masks`          the in-batch false negatives by identity key; :func:`check_negatives`
:mod:`~obliq.losses.term`           :class:`Term`, what a term is: name, weight, what it needs of the data
:mod:`~obliq.losses.teacher`        :class:`TeacherScores`: KL or MarginMSE over a teacher's stored scores
:mod:`~obliq.losses.relational`     :class:`Relational`: in-batch relational KL from the teacher's vectors
:mod:`~obliq.losses.guided`         :class:`GuidedMask`: candidates the teacher scores above the positive left out
:mod:`~obliq.losses.view`           :class:`StepView`: the step's batch as all of them read it, gathered or not
:mod:`~obliq.losses.settings`       the objective as configs give it; spellings of before, read or refused
==================================  ========================================================================

In a recipe (:class:`obliq.model.RetrieverModule` takes a loss and a list of terms by class path; a wrapper
takes the loss it wraps as its ``loss``)::

    model:
      loss:
        class_path: obliq.losses.Symmetric
        init_args:
          loss: {class_path: obliq.losses.MILNCE, init_args: {temperature: 0.05}}
      terms:
        - class_path: obliq.losses.Relational
          init_args: {weight: 0.5}
        - class_path: obliq.losses.GuidedMask
          init_args: {margin: 0.0}

A new loss is a :class:`Loss` subclass in its own file, a new term a :class:`Term` subclass: exported here, with
a config and a test (docs/training.md, "A new loss or term").
"""

from obliq.losses.guided import GuidedMask, guided_mask
from obliq.losses.infonce import InfoNCE, info_nce
from obliq.losses.loss import Loss
from obliq.losses.masks import check_negatives, false_negative_masks, negatives_left
from obliq.losses.matryoshka import Matryoshka, matryoshka
from obliq.losses.multipositive import MILNCE, SupCon, mil_nce_rows, supcon_rows
from obliq.losses.relational import Relational, relational_distillation
from obliq.losses.symmetric import Symmetric
from obliq.losses.teacher import TeacherScores, teacher_distillation
from obliq.losses.term import Term, check_terms
from obliq.losses.view import StepView, positive_mask

__all__ = [
    "MILNCE",
    "GuidedMask",
    "InfoNCE",
    "Loss",
    "Matryoshka",
    "Relational",
    "StepView",
    "SupCon",
    "Symmetric",
    "TeacherScores",
    "Term",
    "check_negatives",
    "check_terms",
    "false_negative_masks",
    "guided_mask",
    "info_nce",
    "matryoshka",
    "mil_nce_rows",
    "negatives_left",
    "positive_mask",
    "relational_distillation",
    "supcon_rows",
    "teacher_distillation",
]
