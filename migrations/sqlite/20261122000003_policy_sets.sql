-- Operator policies set at run time; the newest row is in force.
create table policy_sets (
    id         blob primary key,
    rules      text not null,
    updated_by text not null,
    updated_at text not null
);
