-- CH-benCHmark: TPC-C's nine tables plus supplier, nation and region, each with `fresh_ts`
-- (the time the transaction that last wrote the row was emitted). Table ids follow this order;
-- `retina_bench::chgen` builds the same schemas and a test checks that they agree.
-- history has no key in TPC-C; h_id is a synthetic one, since Retina replays by primary key.

CREATE TABLE warehouse (
    w_id INT NOT NULL,
    w_name VARCHAR(10) NOT NULL,
    w_street_1 VARCHAR(20) NOT NULL,
    w_street_2 VARCHAR(20) NOT NULL,
    w_city VARCHAR(20) NOT NULL,
    w_state CHAR(2) NOT NULL,
    w_zip CHAR(9) NOT NULL,
    w_tax DECIMAL(4,4) NOT NULL,
    w_ytd DECIMAL(12,2) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (w_id)
);

CREATE TABLE district (
    d_id INT NOT NULL,
    d_w_id INT NOT NULL,
    d_name VARCHAR(10) NOT NULL,
    d_street_1 VARCHAR(20) NOT NULL,
    d_street_2 VARCHAR(20) NOT NULL,
    d_city VARCHAR(20) NOT NULL,
    d_state CHAR(2) NOT NULL,
    d_zip CHAR(9) NOT NULL,
    d_tax DECIMAL(4,4) NOT NULL,
    d_ytd DECIMAL(12,2) NOT NULL,
    d_next_o_id INT NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (d_w_id, d_id)
);

CREATE TABLE customer (
    c_id INT NOT NULL,
    c_d_id INT NOT NULL,
    c_w_id INT NOT NULL,
    c_first VARCHAR(16) NOT NULL,
    c_middle CHAR(2) NOT NULL,
    c_last VARCHAR(16) NOT NULL,
    c_street_1 VARCHAR(20) NOT NULL,
    c_street_2 VARCHAR(20) NOT NULL,
    c_city VARCHAR(20) NOT NULL,
    c_state CHAR(2) NOT NULL,
    c_zip CHAR(9) NOT NULL,
    c_phone CHAR(16) NOT NULL,
    c_since TIMESTAMP NOT NULL,
    c_credit CHAR(2) NOT NULL,
    c_credit_lim DECIMAL(12,2) NOT NULL,
    c_discount DECIMAL(4,4) NOT NULL,
    c_balance DECIMAL(12,2) NOT NULL,
    c_ytd_payment DECIMAL(12,2) NOT NULL,
    c_payment_cnt INT NOT NULL,
    c_delivery_cnt INT NOT NULL,
    c_data VARCHAR(500) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (c_w_id, c_d_id, c_id)
);

CREATE TABLE history (
    h_id BIGINT NOT NULL,
    h_c_id INT NOT NULL,
    h_c_d_id INT NOT NULL,
    h_c_w_id INT NOT NULL,
    h_d_id INT NOT NULL,
    h_w_id INT NOT NULL,
    h_date TIMESTAMP NOT NULL,
    h_amount DECIMAL(6,2) NOT NULL,
    h_data VARCHAR(24) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (h_id)
);

CREATE TABLE neworder (
    no_o_id INT NOT NULL,
    no_d_id INT NOT NULL,
    no_w_id INT NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (no_w_id, no_d_id, no_o_id)
);

CREATE TABLE orders (
    o_id INT NOT NULL,
    o_d_id INT NOT NULL,
    o_w_id INT NOT NULL,
    o_c_id INT NOT NULL,
    o_entry_d TIMESTAMP NOT NULL,
    o_carrier_id INT,
    o_ol_cnt INT NOT NULL,
    o_all_local INT NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (o_w_id, o_d_id, o_id)
);

CREATE TABLE orderline (
    ol_o_id INT NOT NULL,
    ol_d_id INT NOT NULL,
    ol_w_id INT NOT NULL,
    ol_number INT NOT NULL,
    ol_i_id INT NOT NULL,
    ol_supply_w_id INT NOT NULL,
    ol_delivery_d TIMESTAMP,
    ol_quantity INT NOT NULL,
    ol_amount DECIMAL(6,2) NOT NULL,
    ol_dist_info CHAR(24) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)
);

CREATE TABLE stock (
    s_i_id INT NOT NULL,
    s_w_id INT NOT NULL,
    s_quantity INT NOT NULL,
    s_dist_01 CHAR(24) NOT NULL,
    s_dist_02 CHAR(24) NOT NULL,
    s_dist_03 CHAR(24) NOT NULL,
    s_dist_04 CHAR(24) NOT NULL,
    s_dist_05 CHAR(24) NOT NULL,
    s_dist_06 CHAR(24) NOT NULL,
    s_dist_07 CHAR(24) NOT NULL,
    s_dist_08 CHAR(24) NOT NULL,
    s_dist_09 CHAR(24) NOT NULL,
    s_dist_10 CHAR(24) NOT NULL,
    s_ytd INT NOT NULL,
    s_order_cnt INT NOT NULL,
    s_remote_cnt INT NOT NULL,
    s_data VARCHAR(50) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (s_w_id, s_i_id)
);

CREATE TABLE item (
    i_id INT NOT NULL,
    i_im_id INT NOT NULL,
    i_name VARCHAR(24) NOT NULL,
    i_price DECIMAL(5,2) NOT NULL,
    i_data VARCHAR(50) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (i_id)
);

CREATE TABLE supplier (
    su_suppkey INT NOT NULL,
    su_name CHAR(25) NOT NULL,
    su_address VARCHAR(40) NOT NULL,
    su_nationkey INT NOT NULL,
    su_phone CHAR(15) NOT NULL,
    su_acctbal DECIMAL(12,2) NOT NULL,
    su_comment CHAR(100) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (su_suppkey)
);

CREATE TABLE nation (
    n_nationkey INT NOT NULL,
    n_name CHAR(25) NOT NULL,
    n_regionkey INT NOT NULL,
    n_comment CHAR(152) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (n_nationkey)
);

CREATE TABLE region (
    r_regionkey INT NOT NULL,
    r_name CHAR(55) NOT NULL,
    r_comment CHAR(152) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (r_regionkey)
);
