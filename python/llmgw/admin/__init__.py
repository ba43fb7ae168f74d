"""The admin API: one route table, its handlers, and the OpenAPI document made from it;
imports nothing from gateway/."""
