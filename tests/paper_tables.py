"""The paper's printed geometry tables, transcribed once (values as printed, not computed).

tab:scale-ladder: (q, L, n_head, d, d_ff, N_tot [B], N_act [B], S) at E=128, K=3, G=4, non-embedding.
RESULT_ROWS: tab:staged-top4 (q from L = 4q) and tab:pareto-B: (q, E, K, G, N_act [B], N_tot [B] or
None where not printed, S).
"""
SCALE_LADDER = [
    (4, 16, 16, 2048, 5120, 15.5, 0.7, 0.954),
    (6, 24, 24, 3072, 7680, 53.2, 2.3, 0.957),
    (8, 32, 32, 4096, 10240, 127.3, 5.4, 0.958),
    (10, 40, 40, 5120, 12800, 250.0, 10.4, 0.958),
    (12, 48, 48, 6144, 15360, 433.7, 17.9, 0.959),
    (14, 56, 56, 7168, 17920, 690.5, 28.2, 0.959),
    (16, 64, 64, 8192, 20480, 1032.8, 41.9, 0.959),
    (18, 72, 72, 9216, 23040, 1472.8, 59.5, 0.960),
]
RESULT_ROWS = [
    (10, 128, 2, 4, 8.5, 250.0, 0.966),   # tab:staged-top4 ID 1
    (10, 128, 2, 8, 5.6, 126.4, 0.956),   # ID 2
    (10, 32, 2, 4, 8.5, 66.0, 0.872),     # ID 3
    (8, 32, 2, 2, 7.3, 65.8, 0.889),      # ID 4
    (12, 96, 2, 4, 14.5, None, 0.956),    # tab:pareto-B
]

# tab:staged-top4: the four staged runs on 64 B200 GPUs (8 p6 nodes), gbs 1024, seqlen 2048, all at
# tp=1, cp=1, pp=4, ep=8, mbs=4: (q, E, K, G, paper's predicted MFU [%], measured MFU / max measured).
# The measured ratios are the only measured MFU of ladder geometries the paper publishes
# (../shared/validation/README.md points to them).
STAGED_RUNS = [
    (10, 128, 2, 4, 14.0, 0.84),
    (10, 128, 2, 8, 11.6, 0.69),
    (10, 32, 2, 4, 21.8, 0.91),
    (8, 32, 2, 2, 23.3, 1.00),
]
STAGED_LAYOUT = {"n_devices": 64, "gbs": 1024, "seqlen": 2048, "tp": 1, "cp": 1, "pp": 4, "ep": 8, "mbs": 4}
