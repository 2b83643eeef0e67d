//! RDMA verbs (InfiniBand, RoCE): libibverbs opened at run time, as NCCL opens it.

pub mod sys;
