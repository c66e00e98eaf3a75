-- HyBench (Zhang et al., VLDB 2024): its eight tables with HyBench's names (conf/ddl_pg.sql of
-- the reference implementation), each with `fresh_ts` (the time the transaction that last wrote
-- the row was emitted). Table ids follow this order; `retina_bench::hybench` builds the same
-- schemas and a test checks that they agree.
-- Differences from HyBench's DDL: money is DECIMAL(15,2), not REAL, so balances add up exactly;
-- every column is NOT NULL but loantrans.contract_timestamp (unset until a loan is accepted);
-- transfer.id is BIGINT (6M rows per scale factor). Names keep HyBench's case: the catalog
-- takes them as written (a PostgreSQL source would quote them to keep that case).

CREATE TABLE customer (
    custID INT NOT NULL,
    companyID INT NOT NULL,
    gender VARCHAR(6) NOT NULL,
    name VARCHAR(15) NOT NULL,
    age INT NOT NULL,
    phone CHAR(11) NOT NULL,
    province VARCHAR(15) NOT NULL,
    city VARCHAR(15) NOT NULL,
    loan_balance DECIMAL(15,2) NOT NULL,
    saving_credit INT NOT NULL,
    checking_credit INT NOT NULL,
    loan_credit INT NOT NULL,
    Isblocked INT NOT NULL,
    created_date DATE NOT NULL,
    last_update_timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (custID)
);

CREATE TABLE company (
    companyID INT NOT NULL,
    name VARCHAR(60) NOT NULL,
    category VARCHAR(60) NOT NULL,
    staff_size INT NOT NULL,
    loan_balance DECIMAL(15,2) NOT NULL,
    phone CHAR(11) NOT NULL,
    province VARCHAR(15) NOT NULL,
    city VARCHAR(15) NOT NULL,
    saving_credit INT NOT NULL,
    checking_credit INT NOT NULL,
    loan_credit INT NOT NULL,
    Isblocked INT NOT NULL,
    created_date DATE NOT NULL,
    last_update_timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (companyID)
);

CREATE TABLE savingAccount (
    accountID INT NOT NULL,
    userID INT NOT NULL,
    balance DECIMAL(15,2) NOT NULL,
    Isblocked INT NOT NULL,
    timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (accountID)
);

CREATE TABLE checkingAccount (
    accountID INT NOT NULL,
    userID INT NOT NULL,
    balance DECIMAL(15,2) NOT NULL,
    Isblocked INT NOT NULL,
    timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (accountID)
);

CREATE TABLE transfer (
    id BIGINT NOT NULL,
    sourceID INT NOT NULL,
    targetID INT NOT NULL,
    amount DECIMAL(15,2) NOT NULL,
    type VARCHAR(10) NOT NULL,
    timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (id)
);

CREATE TABLE checking (
    id INT NOT NULL,
    sourceID INT NOT NULL,
    targetID INT NOT NULL,
    amount DECIMAL(15,2) NOT NULL,
    type VARCHAR(10) NOT NULL,
    timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (id)
);

CREATE TABLE loanapps (
    id INT NOT NULL,
    applicantID INT NOT NULL,
    amount DECIMAL(15,2) NOT NULL,
    duration INT NOT NULL,
    status VARCHAR(12) NOT NULL,
    timestamp TIMESTAMP NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (id)
);

CREATE TABLE loantrans (
    id INT NOT NULL,
    applicantID INT NOT NULL,
    appID INT NOT NULL,
    amount DECIMAL(15,2) NOT NULL,
    status VARCHAR(12) NOT NULL,
    timestamp TIMESTAMP NOT NULL,
    duration INT NOT NULL,
    contract_timestamp TIMESTAMP,
    delinquency INT NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (id)
);
