"""The learners as Ray actors: the one module of the learner that imports Ray."""

import ray

from satseq.actors.learner.host import LearnerHost
from satseq.actors.learner.learner import Learner
from satseq.actors.learner.rank import LearnerRank

LearnerActor = ray.remote(Learner)
LearnerRankActor = ray.remote(LearnerRank)
LearnerHostActor = ray.remote(LearnerHost)
