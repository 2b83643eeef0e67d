#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define S(t) printf("size %s %zu align %zu\n", #t, sizeof(struct t), _Alignof(struct t))
#define O(t,f) printf("  %s.%s %zu\n", #t, #f, offsetof(struct t, f))
int main(){
S(ibv_context); O(ibv_context,device);O(ibv_context,ops);O(ibv_context,cmd_fd);O(ibv_context,async_fd);O(ibv_context,num_comp_vectors);O(ibv_context,mutex);O(ibv_context,abi_compat);
S(ibv_context_ops); O(ibv_context_ops,poll_cq);O(ibv_context_ops,req_notify_cq);O(ibv_context_ops,post_send);O(ibv_context_ops,post_recv);O(ibv_context_ops,post_srq_recv);
S(ibv_device_attr); O(ibv_device_attr,fw_ver);O(ibv_device_attr,node_guid);O(ibv_device_attr,max_mr_size);O(ibv_device_attr,max_qp);O(ibv_device_attr,max_qp_wr);O(ibv_device_attr,max_sge);O(ibv_device_attr,max_cqe);O(ibv_device_attr,max_mr);O(ibv_device_attr,max_qp_rd_atom);O(ibv_device_attr,phys_port_cnt);
S(ibv_port_attr); O(ibv_port_attr,state);O(ibv_port_attr,max_mtu);O(ibv_port_attr,active_mtu);O(ibv_port_attr,gid_tbl_len);O(ibv_port_attr,port_cap_flags);O(ibv_port_attr,max_msg_sz);O(ibv_port_attr,lid);O(ibv_port_attr,sm_lid);O(ibv_port_attr,active_width);O(ibv_port_attr,active_speed);O(ibv_port_attr,phys_state);O(ibv_port_attr,link_layer);O(ibv_port_attr,flags);O(ibv_port_attr,port_cap_flags2);
S(ibv_pd); O(ibv_pd,context);O(ibv_pd,handle);
S(ibv_mr); O(ibv_mr,context);O(ibv_mr,pd);O(ibv_mr,addr);O(ibv_mr,length);O(ibv_mr,handle);O(ibv_mr,lkey);O(ibv_mr,rkey);
S(ibv_cq); O(ibv_cq,context);O(ibv_cq,channel);O(ibv_cq,cq_context);O(ibv_cq,handle);O(ibv_cq,cqe);O(ibv_cq,mutex);O(ibv_cq,cond);O(ibv_cq,comp_events_completed);O(ibv_cq,async_events_completed);
S(ibv_qp); O(ibv_qp,context);O(ibv_qp,qp_context);O(ibv_qp,pd);O(ibv_qp,send_cq);O(ibv_qp,recv_cq);O(ibv_qp,srq);O(ibv_qp,handle);O(ibv_qp,qp_num);O(ibv_qp,state);O(ibv_qp,qp_type);O(ibv_qp,mutex);O(ibv_qp,cond);O(ibv_qp,events_completed);
S(ibv_qp_cap); O(ibv_qp_cap,max_send_wr);O(ibv_qp_cap,max_recv_wr);O(ibv_qp_cap,max_send_sge);O(ibv_qp_cap,max_recv_sge);O(ibv_qp_cap,max_inline_data);
S(ibv_qp_init_attr); O(ibv_qp_init_attr,qp_context);O(ibv_qp_init_attr,send_cq);O(ibv_qp_init_attr,recv_cq);O(ibv_qp_init_attr,srq);O(ibv_qp_init_attr,cap);O(ibv_qp_init_attr,qp_type);O(ibv_qp_init_attr,sq_sig_all);
S(ibv_global_route); O(ibv_global_route,dgid);O(ibv_global_route,flow_label);O(ibv_global_route,sgid_index);O(ibv_global_route,hop_limit);O(ibv_global_route,traffic_class);
S(ibv_ah_attr); O(ibv_ah_attr,grh);O(ibv_ah_attr,dlid);O(ibv_ah_attr,sl);O(ibv_ah_attr,src_path_bits);O(ibv_ah_attr,static_rate);O(ibv_ah_attr,is_global);O(ibv_ah_attr,port_num);
S(ibv_qp_attr); O(ibv_qp_attr,qp_state);O(ibv_qp_attr,cur_qp_state);O(ibv_qp_attr,path_mtu);O(ibv_qp_attr,path_mig_state);O(ibv_qp_attr,qkey);O(ibv_qp_attr,rq_psn);O(ibv_qp_attr,sq_psn);O(ibv_qp_attr,dest_qp_num);O(ibv_qp_attr,qp_access_flags);O(ibv_qp_attr,cap);O(ibv_qp_attr,ah_attr);O(ibv_qp_attr,alt_ah_attr);O(ibv_qp_attr,pkey_index);O(ibv_qp_attr,alt_pkey_index);O(ibv_qp_attr,en_sqd_async_notify);O(ibv_qp_attr,sq_draining);O(ibv_qp_attr,max_rd_atomic);O(ibv_qp_attr,max_dest_rd_atomic);O(ibv_qp_attr,min_rnr_timer);O(ibv_qp_attr,port_num);O(ibv_qp_attr,timeout);O(ibv_qp_attr,retry_cnt);O(ibv_qp_attr,rnr_retry);O(ibv_qp_attr,alt_port_num);O(ibv_qp_attr,alt_timeout);O(ibv_qp_attr,rate_limit);
S(ibv_sge); O(ibv_sge,addr);O(ibv_sge,length);O(ibv_sge,lkey);
S(ibv_send_wr); O(ibv_send_wr,wr_id);O(ibv_send_wr,next);O(ibv_send_wr,sg_list);O(ibv_send_wr,num_sge);O(ibv_send_wr,opcode);O(ibv_send_wr,send_flags);O(ibv_send_wr,imm_data);O(ibv_send_wr,wr.rdma.remote_addr);O(ibv_send_wr,wr.rdma.rkey);O(ibv_send_wr,qp_type);O(ibv_send_wr,bind_mw);
S(ibv_recv_wr); O(ibv_recv_wr,wr_id);O(ibv_recv_wr,next);O(ibv_recv_wr,sg_list);O(ibv_recv_wr,num_sge);
S(ibv_wc); O(ibv_wc,wr_id);O(ibv_wc,status);O(ibv_wc,opcode);O(ibv_wc,vendor_err);O(ibv_wc,byte_len);O(ibv_wc,imm_data);O(ibv_wc,qp_num);O(ibv_wc,src_qp);O(ibv_wc,wc_flags);O(ibv_wc,pkey_index);O(ibv_wc,slid);O(ibv_wc,sl);O(ibv_wc,dlid_path_bits);
S(ibv_async_event); O(ibv_async_event,element);O(ibv_async_event,event_type);
printf("gid %zu\n", sizeof(union ibv_gid));
printf("MASK STATE %d AV %d PORT %d PKEY %d ACCESS %d PATH_MTU %d DEST_QPN %d RQ_PSN %d MAX_DEST_RD_ATOMIC %d MIN_RNR_TIMER %d SQ_PSN %d TIMEOUT %d RETRY_CNT %d RNR_RETRY %d MAX_QP_RD_ATOMIC %d\n", IBV_QP_STATE, IBV_QP_AV, IBV_QP_PORT, IBV_QP_PKEY_INDEX, IBV_QP_ACCESS_FLAGS, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_MAX_QP_RD_ATOMIC);
printf("OPC WRITE %d WRITE_IMM %d SEND %d SEND_IMM %d READ %d\n", IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ);
printf("WC OPC SEND %d RDMA_WRITE %d RDMA_READ %d RECV %d RECV_RDMA_WITH_IMM %d\n", IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM);
printf("WC ST SUCCESS %d LOC_LEN %d LOC_QP_OP %d LOC_PROT %d WR_FLUSH %d REM_ACCESS %d REM_OP %d RETRY_EXC %d RNR_RETRY_EXC %d REM_INV_REQ %d GENERAL %d\n", IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_GENERAL_ERR);
printf("ACCESS LW %d RW %d RR %d RA %d RELAXED %d\n", IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_RELAXED_ORDERING);
printf("SEND FLAGS FENCE %d SIGNALED %d SOLICITED %d INLINE %d\n", IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE);
printf("WC_WITH_IMM %d QPT_RC %d LINK IB %d ETH %d PORT_ACTIVE %d MTU_4096 %d MTU_1024 %d\n", IBV_WC_WITH_IMM, IBV_QPT_RC, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_ETHERNET, IBV_PORT_ACTIVE, IBV_MTU_4096, IBV_MTU_1024);
printf("QPS RESET %d INIT %d RTR %d RTS %d SQD %d SQE %d ERR %d\n", IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR);
}
